"""Targeted checks of the KV stores and the attention core (tests/test_kv_cache.py drives
them with random schedules against a dense oracle): mask kinds, capacity and trim limits,
rollback, protocol misuse, policies, storage dtype, laziness and the in-place write.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from dense_reference import dense_attention

from mlxgraph.interpreter.attention import attend
from mlxgraph.interpreter.cache.kv_cache import CacheError, CachePolicy, make_store
from mlxgraph.schema.records import LayerCacheInfo


def geom(kv=2, d=8, dv=8, window=0, layer=0):
    """A small layer geometry."""
    return LayerCacheInfo(layer, kv, d, dv, window)


def kv(t, g=None, batch=1, seed=0):
    """Random float32 k, v for t tokens of geometry g."""
    g = g or geom()
    r = np.random.default_rng(seed)
    return (mx.array(r.standard_normal((batch, g.kv_heads, t, g.head_dim)).astype(np.float32)),
            mx.array(r.standard_normal((batch, g.kv_heads, t, g.v_head_dim)).astype(np.float32)))


def step(store, t, seed=0):
    """Run a committed step; return (keys, values, mask)."""
    out = store.update(*kv(t, store.geometry, seed=seed))
    store.commit()
    return out


def kind(mask):
    """None, "causal", or the shape of an explicit mask."""
    return mask if mask is None or isinstance(mask, str) else tuple(mask.shape)


def test_mask_kinds_prefer_fused():
    flat = make_store(geom(), CachePolicy(capacity=64, kv_dtype=None))
    assert kind(step(flat, 5)[2]) == "causal"
    keys, _, mask = step(flat, 1)
    assert mask is None and keys.shape[2] == 6
    sliding = make_store(geom(window=4), CachePolicy(capacity=64, kv_dtype=None))
    assert kind(step(sliding, 3)[2]) == "causal"  # the band does not bite yet
    assert kind(step(sliding, 6)[2]) == (6, 9)  # the band bites: positions 3..8 over keys 0..8
    keys, _, mask = step(sliding, 1)
    assert mask is None and keys.shape[2] == 4  # decode: a view of the last 4 keys
    ring = make_store(geom(window=4), CachePolicy(capacity=0, kv_dtype=None, window=4))
    for i in range(9):
        keys, _, mask = step(ring, 1, seed=i)
    assert mask is None and keys.shape[2] == 4  # wrapped, full: order does not matter
    ring2 = make_store(geom(window=4), CachePolicy(capacity=0, kv_dtype=None, window=4, max_step=3))
    step(ring2, 5)
    assert kind(step(ring2, 3)[2]) == (3, 6)  # out-of-order slots need an explicit mask


def test_capacity_rejection_names_the_numbers_and_changes_nothing():
    store = make_store(geom(), CachePolicy(capacity=8, kv_dtype=None, preallocate=True))
    step(store, 6)
    before = (store.length, store.nbytes, store.state)
    with pytest.raises(CacheError, match=r"3 tokens at length 6 exceeds the capacity of 8"):
        store.begin(3)
    assert (store.length, store.nbytes) == before[:2]
    assert all(a is b for a, b in zip(store.state, before[2], strict=True))
    step(store, 2)
    assert store.length == 8


def test_ring_trim_keeps_max_step_slots_and_says_how_far():
    store = make_store(geom(window=4), CachePolicy(capacity=0, kv_dtype=None, window=4, max_step=3))
    for i in range(20):
        step(store, 1, seed=i)
    assert store.max_trim == 3  # window + max_step - 1 slots: max_step positions to spare
    with pytest.raises(CacheError, match="at most 3"):
        store.trim(4)
    assert store.trim(3) == 17 and store.max_trim == 0
    with pytest.raises(CacheError, match="at most 0"):
        store.trim(1)
    flat = make_store(geom(), CachePolicy(capacity=32, kv_dtype=None))
    step(flat, 10)
    with pytest.raises(CacheError, match="at most 10"):
        flat.trim(11)
    assert flat.trim(10) == 0


@pytest.mark.parametrize("policy", [
    CachePolicy(capacity=32, kv_dtype=None, preallocate=True),
    CachePolicy(capacity=32, kv_dtype=mx.float16),
    CachePolicy(capacity=0, kv_dtype=None, window=4, max_step=2),
])
def test_rollback_leaves_the_store_as_before(policy):
    g = geom(window=policy.window)
    a, b = make_store(g, policy), make_store(g, policy)
    for s in (a, b):
        step(s, 7)
    state = a.state
    for t in (1, 2, 5):  # in place, wrapping, linearised (ring)
        out = a.update(*kv(t, g, seed=99))
        mx.eval(out[0], out[1])  # even evaluated, the staged write must not leak
        a.rollback()
        assert a.length == 7 and all(x is y for x, y in zip(a.state, state, strict=True))
    q = mx.array(np.random.default_rng(5).standard_normal((1, 4, 2, 8)).astype(np.float32))
    outs = [attend(q, *step(s, 2, seed=3), 0.3, mx.float32) for s in (a, b)]
    assert np.array_equal(np.array(outs[0]), np.array(outs[1]))


def test_protocol_misuse_raises_cache_error():
    store = make_store(geom(), CachePolicy(capacity=16, kv_dtype=None))
    with pytest.raises(CacheError, match="positive int"):
        store.begin(0)
    with pytest.raises(CacheError, match="without a staged"):
        store.commit()
    store.begin(2)
    with pytest.raises(CacheError, match="already open"):
        store.begin(2)
    with pytest.raises(CacheError, match="while a step is open"):
        store.trim(0)
    with pytest.raises(CacheError, match="update\\(\\) got T=1"):
        store.update(*kv(1))
    store.update(*kv(2))
    with pytest.raises(CacheError, match="already called"):
        store.update(*kv(2))
    store.commit()
    with pytest.raises(CacheError, match="batch 2"):
        store.update(*kv(1, batch=2))
    with pytest.raises(CacheError, match="floating"):
        store.update(mx.zeros((1, 2, 1, 8), dtype=mx.int32), mx.zeros((1, 2, 1, 8)))
    with pytest.raises(CacheError, match="non-negative"):
        store.trim(-1)
    assert store.length == 2 and store.update(*kv(1))[0].shape[2] == 3  # no step left open


def test_make_store_rejects_bad_policies():
    with pytest.raises(CacheError, match="smaller than the layer's sliding window 8"):
        make_store(geom(window=8), CachePolicy(capacity=0, kv_dtype=None, window=4))
    with pytest.raises(CacheError, match="kv_dtype"):
        make_store(geom(), CachePolicy(capacity=8, kv_dtype=mx.int8))
    with pytest.raises(CacheError, match="capacity >= 1"):
        make_store(geom(), CachePolicy(capacity=0, kv_dtype=None))
    with pytest.raises(CacheError, match="max_step"):
        make_store(geom(), CachePolicy(capacity=8, kv_dtype=None, window=4, max_step=0))


def test_storage_dtype_is_separate_from_compute_dtype():
    store = make_store(geom(dv=16), CachePolicy(capacity=64, kv_dtype=mx.float16, preallocate=True))
    keys, values, _ = step(store, 3)
    assert keys.dtype == values.dtype == mx.float32
    assert all(a.dtype == mx.float16 for a in store.state)
    assert store.nbytes == 64 * 2 * (8 + 16) * 2  # slots * heads * (D + Dv) * 2 bytes
    assert store.bytes_per_token == store.nbytes / 3


def test_a_whole_step_builds_one_lazy_graph():
    """Trace steps under mx.compile: any evaluation or host read inside raises."""
    g = geom(window=4, dv=16)
    sizes = (6, 1, 1, 2, 5, 1)  # prefill, decodes, in-place chunk, linearised chunk (ring)

    def steps(*arrays):
        stores = [make_store(g, CachePolicy(capacity=32, kv_dtype=mx.float16)),
                  make_store(g, CachePolicy(capacity=0, kv_dtype=None, window=4, max_step=2))]
        outs = []
        for i, t in enumerate(sizes):
            q, k, v = arrays[3 * i : 3 * i + 3]
            for s in stores:
                s.begin(t)
            outs += [attend(q, *s.update(k, v), 0.35, mx.float32) for s in stores]
            for s in stores:
                s.commit()
            if i == 3:
                for s in stores:
                    s.trim(1)
        return outs

    r = np.random.default_rng(0)
    arrays = []
    for t in sizes:
        arrays += [mx.array(r.standard_normal(shape).astype(np.float32))
                   for shape in ((1, 4, t, 8), (1, 2, t, 8), (1, 2, t, 16))]
    traced = mx.compile(steps)(*arrays)
    for x, y in zip(traced, steps(*arrays), strict=True):
        np.testing.assert_allclose(np.array(x), np.array(y), atol=1e-6)


@pytest.mark.parametrize("window", [0, 2048])
def test_decode_write_does_not_copy_the_buffer(window):
    """Peak memory of a decode step stays far below the cache size (the write is in place)."""
    g = LayerCacheInfo(0, 8, 64, 64, window)
    policy = CachePolicy(capacity=16384, kv_dtype=None, preallocate=True, window=window)
    store = make_store(g, policy)
    step(store, 3000)
    mx.eval(*store.state)
    q = mx.zeros((1, 16, 1, 64))
    extra = []
    for hold_old in (False, True):
        k, v = kv(1, g, seed=1)
        mx.eval(k, v)
        old = store.state if hold_old else ()  # control: a live reference forces a copy
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        out = attend(q, *store.update(k, v), 0.125, mx.float32)
        store.commit()
        mx.eval(out, *store.state)
        # The peak counts everything live, so subtract what was live before the step.
        extra.append(max(0, mx.get_peak_memory() - before))
        del old
    assert extra[0] < 0.1 * store.nbytes < extra[1]


@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_attend_gqa_and_value_dim_against_reference(group):
    r = np.random.default_rng(group)
    q = r.standard_normal((2, 2 * group, 3, 16)).astype(np.float32)
    k = r.standard_normal((2, 2, 7, 16)).astype(np.float32)
    v = r.standard_normal((2, 2, 7, 24)).astype(np.float32)
    band = np.tril(np.ones((3, 7), bool), 4) & ~np.tril(np.ones((3, 7), bool), 1)
    for mask, window in ((None, None), ("causal", 0), (mx.array(band), 3)):
        out = attend(mx.array(q), mx.array(k), mx.array(v), mask, 0.25, mx.float16)
        assert out.dtype == mx.float16 and out.shape == (2, 2 * group, 3, 24)
        if window is None:
            scores = np.einsum("bhgtd,bhsd->bhgts", q.reshape(2, 2, group, 3, 16), k) * 0.25
            w = np.exp(scores - scores.max(-1, keepdims=True))
            ref = np.einsum("bhgts,bhsv->bhgtv", w / w.sum(-1, keepdims=True), v).reshape(
                2, 2 * group, 3, 24
            )
        else:
            ref = dense_attention(q, k, v, window, 0.25)
        np.testing.assert_allclose(np.array(out.astype(mx.float32)), ref, atol=2e-3, rtol=2e-3)
    with pytest.raises(ValueError, match="multiple"):
        attend(mx.zeros((2, 3, 1, 16)), mx.array(k), mx.array(v), None, 1.0, mx.float32)
    with pytest.raises(ValueError, match="mask shape"):
        attend(
            mx.array(q), mx.array(k), mx.array(v), mx.ones((3, 6), dtype=mx.bool_), 1.0, mx.float32
        )
