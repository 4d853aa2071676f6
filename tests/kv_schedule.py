"""test_kv_cache's random schedules: layers driven against a dense float64 oracle."""

from __future__ import annotations

import copy

import mlx.core as mx
import numpy as np
import pytest
from dense_reference import History, dense_attention

from mlxgraph.interpreter.attention import attend
from mlxgraph.interpreter.cache.kv_cache import CacheError, CachePolicy, make_store
from mlxgraph.schema.records import LayerCacheInfo

ATOL, RTOL = 2e-5, 2e-4
TOTALS = {"schedules": 0, "steps": 0, "attentions": 0, "rejected": 0, "forks": 0, "restores": 0,
          "seconds": 0.0}


class Layer:
    """A store plus the oracle's view of it (history and the documented rewind contract)."""

    def __init__(self, geometry: LayerCacheInfo, policy: CachePolicy, batch: int, group: int,
                 sinks=None, softcap: float = 0.0):
        self.g, self.p, self.group = geometry, policy, group
        self.sinks, self.softcap = sinks, softcap
        self.store = make_store(geometry, policy)
        self.hist = History(geometry.kv_heads, geometry.head_dim, geometry.v_head_dim, batch)
        chunk = geometry.attention_chunk
        # A chunked layer is a ring of one chunk whatever the policy says.
        self.ring = policy.window > 0 or chunk > 0
        self.window = chunk or geometry.sliding_window or policy.window
        slots = (chunk or policy.window) + policy.max_step - 1
        self.slots = slots if self.ring else policy.capacity
        self.oldest = 0  # contract: a store keeps at least the last `slots` positions written

    def fits(self, t: int) -> bool:
        """Whether a step of t tokens must be accepted (only flat stores have a capacity)."""
        return self.ring or self.hist.length + t <= self.p.capacity

    def max_rewind(self) -> int:
        """How far trim must be able to rewind: the rewound position still needs its window."""
        n = self.hist.length
        return n if self.oldest == 0 else n - (self.oldest + self.window - 1)

    def reset(self) -> None:
        """Reset the store and the oracle together."""
        self.store.reset()
        self.hist.trim(self.hist.length)
        self.oldest = 0

    def fork(self, store=None) -> Layer:
        """A second branch: the store's fork (or ``store``) with a copy of the oracle."""
        twin = copy.copy(self)
        twin.store = self.store.fork() if store is None else store
        twin.hist = copy.deepcopy(self.hist)
        return twin


def rounded(x: np.ndarray, policy: CachePolicy) -> np.ndarray:
    """What storing x under `policy` (dtype or quantized) and reading it back gives."""
    if policy.kv_bits:
        q = mx.quantize(mx.array(x), group_size=policy.kv_group_size, bits=policy.kv_bits)
        return np.array(mx.dequantize(*q, group_size=policy.kv_group_size, bits=policy.kv_bits))
    dtype = policy.kv_dtype
    return np.array(mx.array(x).astype(dtype).astype(mx.float32)) if dtype is not None else x


def random_layer(
    rng, kind: str, layer_id: int, batch: int, kv_dtype, scale: int = 1, bits: int = 0
) -> Layer:
    """A random geometry (GQA 1/2/4/8, Dv != D sometimes) and a policy of the given kind;
    a third get sinks, a third softcapping (own generator: the schedule's stream is unchanged)."""
    hkv = int(rng.choice([1, 2, 4]))
    group = int(rng.choice([1, 2, 4, 8]))
    d = int(rng.choice([32, 64] if bits else [8, 16]))
    dv = int(rng.choice([d, 32, 96] if bits else [d, 8, 24]))
    quant = {"kv_bits": bits, "kv_group_size": 32} if bits else {}
    aux = np.random.default_rng((layer_id, hkv, group, d, dv, len(kind)))
    sinks = 2 * aux.standard_normal(hkv * group, np.float32) if aux.random() < 1 / 3 else None
    softcap = float(aux.choice([0.7, 1.5, 4.0])) if aux.random() < 1 / 3 else 0.0
    extras = (batch, group, sinks, softcap)
    if kind == "chunk":
        chunk = int(rng.choice([2, 3, 5, 8] + ([32] if scale > 1 else [])))
        policy = CachePolicy(capacity=int(rng.integers(24, 120 * scale)), kv_dtype=kv_dtype,
                             window=int(rng.choice([0, 4])), max_step=int(rng.choice([1, 2, 4])),
                             **quant)
        return Layer(LayerCacheInfo(layer_id, hkv, d, dv, 0, chunk), policy, *extras)
    if kind == "ring":
        window = int(rng.choice([2, 3, 5, 8, 16] + ([33, 64] if scale > 1 else [])))
        model = int(rng.choice([window, max(1, window - 2), 0]))  # 0: ring on a full layer
        policy = CachePolicy(capacity=0, kv_dtype=kv_dtype, preallocate=bool(rng.random() < 0.5),
                             window=window, max_step=int(rng.choice([1, 2, 4])), **quant)
    else:
        model = int(rng.choice([0, 0, 6, 17]))
        policy = CachePolicy(capacity=int(rng.integers(24, 120 * scale)), kv_dtype=kv_dtype,
                             preallocate=kind == "static", **quant)
    return Layer(LayerCacheInfo(layer_id, hkv, d, dv, model), policy, *extras)


def run_step(rng, layers: list[Layer], t: int, rollback: bool) -> list | None:
    """One session step over all layers: begin all, update all, commit (or roll back).

    Returns the committed step's attention outputs (numpy), None if it was rejected."""
    begun = []
    try:
        for layer in layers:
            layer.store.begin(t)
            begun.append(layer)
    except CacheError as err:
        assert "capacity" in str(err) and not all(la.fits(t) for la in layers)
        for layer in begun:
            layer.store.rollback()
        TOTALS["rejected"] += 1
        return None
    assert all(la.fits(t) for la in layers), "begin accepted a step over capacity"
    batch = layers[0].hist.keys.shape[0]
    pending = []
    for la in layers:
        g = la.g
        q = rng.standard_normal((batch, g.kv_heads * la.group, t, g.head_dim)).astype(np.float32)
        k = rng.standard_normal((batch, g.kv_heads, t, g.head_dim)).astype(np.float32)
        v = rng.standard_normal((batch, g.kv_heads, t, g.v_head_dim)).astype(np.float32)
        scale = g.head_dim**-0.5
        keys, values, mask = la.store.update(mx.array(k), mx.array(v))
        sinks = None if la.sinks is None else mx.array(la.sinks)
        out = attend(mx.array(q), keys, values, mask, scale, mx.float32, sinks=sinks,
                     softcap=la.softcap)
        pending.append((la, q, k, v, scale, out))
    if rollback:
        if rng.random() < 0.5:  # evaluating before rollback must not damage the old state
            mx.eval([p[-1] for p in pending])
        for la in layers:
            la.store.rollback()
        TOTALS["rejected"] += 1
        return None
    for la in layers:
        la.store.commit()
    mx.eval([p[-1] for p in pending])
    for la, q, k, v, scale, out in pending:
        la.hist.append(rounded(k, la.p), rounded(v, la.p))
        la.oldest = max(la.oldest, la.hist.length - la.slots)
        chunk = la.g.attention_chunk  # the chunk bounds what a query sees; no window besides
        ref = dense_attention(q, la.hist.keys, la.hist.values, 0 if chunk else la.window, scale,
                              chunk, la.sinks, la.softcap)
        np.testing.assert_allclose(np.array(out), ref, atol=ATOL, rtol=RTOL)
        assert la.store.length == la.hist.length
        TOTALS["attentions"] += 1
    TOTALS["steps"] += 1
    return [np.array(p[-1]) for p in pending]


def same_next_step(rng, a: list[Layer], b: list[Layer]) -> None:
    """Feed both branches the same random step: outputs must be bitwise equal."""
    t = int(rng.integers(1, 6))
    twin_rng = copy.deepcopy(rng)
    out_a, out_b = run_step(rng, a, t, rollback=False), run_step(twin_rng, b, t, rollback=False)
    assert (out_a is None) == (out_b is None)
    for x, y in zip(out_a or [], out_b or [], strict=True):
        np.testing.assert_array_equal(x, y)


def run_fork(rng, layers: list[Layer]) -> None:
    """Fork every store; the branches agree bitwise on the same input, then the fork runs a
    few random operations of its own (the original's later steps show it was untouched)."""
    twins = [la.fork() for la in layers]
    same_next_step(rng, layers, twins)
    for _ in range(int(rng.integers(1, 6))):
        r = rng.random()
        if r < 0.6:
            run_step(rng, twins, int(rng.integers(1, 12)), rollback=r < 0.1)
        else:
            run_trim(rng, twins)
    TOTALS["forks"] += 1


def run_save_restore(rng, layers: list[Layer], tmp_path) -> list[Layer]:
    """Snapshot every store through a safetensors file into fresh stores; the restored and
    the uninterrupted stores agree bitwise on the same input. Returns the restored layers."""
    from mlxgraph.interpreter.cache.safetensors_io import SafetensorsFile, write

    tensors, infos, bf16 = {}, [], {}
    for la in layers:
        info, arrays = la.store.snapshot()
        infos.append(info)
        for n, a in arrays.items():
            tensors[f"{la.g.layer_id}.{n}"] = a
            if info["dtype"] == "bfloat16":
                bf16[f"{la.g.layer_id}.{n}"] = "BF16"
    path = tmp_path / "snapshot.safetensors"
    write(path, tensors, {}, bf16)
    back = SafetensorsFile(path)
    restored = []
    for la, info in zip(layers, infos, strict=True):
        store = make_store(la.g, la.p)
        arrays = {
            n: back.array(f"{la.g.layer_id}.{n}") for n in ("keys", "values") if info["slots"]
        }
        store.load_snapshot(store.checked_snapshot(info, arrays))
        assert store.describe() | {"allocated_slots": 0, "bytes": 0} == la.store.describe() | {
            "allocated_slots": 0, "bytes": 0}
        restored.append(la.fork(store))
    same_next_step(rng, layers, restored)
    TOTALS["restores"] += 1
    return restored


def run_trim(rng, layers: list[Layer]) -> None:
    """Trim every layer, or check that the ones that cannot rewind refuse and stay put."""
    n = (
        int(rng.integers(0, 4))
        if rng.random() < 0.8
        else int(rng.integers(0, layers[0].hist.length + 3))
    )
    for la in layers:
        assert la.store.max_trim == la.max_rewind()
    if all(n <= la.max_rewind() for la in layers):
        for la in layers:
            assert la.store.trim(n) == la.hist.length - n
            la.hist.trim(n)
        return
    for la in layers:  # the layers that cannot rewind say so and stay as they were
        if n > la.max_rewind():
            with pytest.raises(CacheError, match=f"at most {la.max_rewind()}"):
                la.store.trim(n)
            assert la.store.length == la.hist.length
            TOTALS["rejected"] += 1


def run_bad_input(rng, layers: list[Layer]) -> None:
    """A wrongly shaped update is refused and leaves no step open."""
    la = layers[int(rng.integers(len(layers)))]
    g = la.g
    k = mx.zeros((la.hist.keys.shape[0], g.kv_heads + 1, 1, g.head_dim))
    v = mx.zeros((la.hist.keys.shape[0], g.kv_heads + 1, 1, g.v_head_dim))
    with pytest.raises(CacheError, match="expected k"):
        la.store.update(k, v)
    TOTALS["rejected"] += 1


def run_schedule(
    seed: int,
    kinds: list[str],
    ops: int,
    kv_dtype=None,
    big: int = 40,
    scale: int = 1,
    bits: int = 0,
    tmp_path=None,
) -> None:
    """Drive one random schedule; every committed step is checked against the oracle."""
    rng = np.random.default_rng(seed)
    batch = int(rng.choice([1, 2]))
    layers = [
        random_layer(rng, kind, i, batch, kv_dtype, scale, bits) for i, kind in enumerate(kinds)
    ]
    flat_room = min((la.p.capacity for la in layers if not la.ring), default=None)
    for _ in range(ops):
        r = rng.random()
        length = layers[0].hist.length
        if r < 0.45:
            run_step(rng, layers, 1, rollback=False)
        elif r < 0.65:
            run_step(rng, layers, int(rng.integers(2, 9)), rollback=False)
        elif r < 0.70:
            run_step(rng, layers, int(rng.integers(9, big)), rollback=False)
        elif r < 0.75 and flat_room is not None:
            run_step(
                rng, layers, max(1, flat_room - length + int(rng.integers(1, 4))), rollback=False
            )
        elif r < 0.80:
            run_step(rng, layers, int(rng.integers(1, 6)), rollback=True)
        elif r < 0.90:
            run_trim(rng, layers)
        elif r < 0.92:
            run_fork(rng, layers)
        elif r < 0.94 and tmp_path is not None:
            layers = run_save_restore(rng, layers, tmp_path)
        elif r < 0.97:
            run_bad_input(rng, layers)
        else:
            for la in layers:
                la.reset()
    TOTALS["schedules"] += 1


FAMILIES = {
    "flat-static": (["static"], None),
    "flat-dynamic": (["dynamic"], None),
    "ring": (["ring"], None),
    "mix": (["static", "dynamic", "ring", "ring"], None),
    "mix-f16-storage": (["static", "dynamic", "ring"], mx.float16),
    "mix-bf16-storage": (["dynamic", "ring"], mx.bfloat16),
    "mix-q8": (["static", "dynamic", "ring"], 8),
    "mix-q4": (["dynamic", "ring"], 4),
    "chunk": (["chunk"], None),
    "mix-chunk": (["static", "ring", "chunk", "chunk"], None),
    "mix-chunk-q8": (["dynamic", "chunk"], 8),
}
