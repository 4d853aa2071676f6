"""Session state as a value: windows that keep a layer's math, fork and copy semantics,
save/restore (bitwise continuation, refusals that change nothing), quantized KV, describe.

Oracles: the dense float64 TinyOracle, and an uninterrupted session fed the same tokens
(bitwise where the storage is exact).
"""

import copy
import json
import pickle

import mlx.core as mx
import numpy as np
import pytest
from synthetic_graphs import llama
from tiny_graph import VOCAB, TinyOracle, build_tiny_graph

import mlxgraph
from mlxgraph.interpreter.cache.kv_cache import CacheError
from mlxgraph.interpreter.errors import CacheFileError

TOL = 2e-4


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """{'mixed': (path, weights)}: sliding 3 + full layers; 'sliding8'; 'other' (other weights)."""
    folder = tmp_path_factory.mktemp("g")
    out = {}
    for name, windows, seed in (("mixed", (3, 0), 0), ("sliding8", (8,), 0), ("other", (3, 0), 1)):
        path = folder / f"{name}.mlxg"
        out[name] = (path, build_tiny_graph(path, seed=seed, windows=windows))
    return out


def feed(session, rng, steps, sizes=(1, 1, 2, 3, 5)):
    """Random steps; returns [(tokens, logits as numpy)]."""
    out = []
    for _ in range(steps):
        toks = rng.integers(0, VOCAB, int(rng.choice(sizes)))
        logits = session.step(
            mx.array(toks[None].astype(np.int32)), range(session.length, session.length + len(toks))
        )
        out.append((toks, np.array(logits)))
    return out


def replay(session, fed):
    """Feed ``fed``'s tokens again; the logits must be bitwise what ``fed`` recorded."""
    for toks, want in fed:
        got = session.step(
            mx.array(toks[None].astype(np.int32)), range(session.length, session.length + len(toks))
        )
        np.testing.assert_array_equal(np.array(got), want)


def check_oracle(fed, oracle):
    for toks, logits in fed:
        want = oracle.step(toks)
        assert np.abs(logits.reshape(want.shape) - want).max() <= TOL * max(1.0, np.abs(want).max())


# ------------------------------------------------------------------------ windows
def test_ring_smaller_than_the_layers_window_is_refused(graphs):
    program = mlxgraph.load(graphs["sliding8"][0])
    with pytest.raises(
        CacheError, match="ring window 4 is smaller than the layer's sliding window 8"
    ):
        program.session(windows=4)
    with pytest.raises(CacheError, match="smaller than the layer's sliding window 8"):
        program.session(windows={0: 7})


def test_windows_never_change_a_sliding_layers_math(graphs):
    path, wts = graphs["sliding8"]
    program = mlxgraph.load(path)
    # A flat store (0), a bigger ring (20) and the default ring: all the model's window-8 math.
    for windows in (None, 0, 20):
        session = program.session(capacity=64, windows=windows, max_step=2)
        assert session.approximations == {}
        check_oracle(feed(session, np.random.default_rng(3), 15), TinyOracle(wts, windows=(8,)))


def test_window_on_a_full_layer_is_an_explicit_approximation(graphs):
    program = mlxgraph.load(graphs["mixed"][0])
    assert program.session().approximations == {}
    session = program.session(windows={1: 5})
    assert session.approximations == {1: 5}
    assert session.describe()["approximations"] == {"1": 5}


# ------------------------------------------------------------------------ fork
def test_fork_and_copies_are_independent_and_bitwise_equal(graphs):
    path, wts = graphs["mixed"]
    program = mlxgraph.load(path)
    for make in (lambda s: s.fork(), copy.copy, copy.deepcopy):
        session = program.session(capacity=64, max_step=3)
        prefix = feed(session, np.random.default_rng(0), 6)
        twin, idle = make(session), make(session)
        assert twin.length == session.length and twin.stores[0] is not session.stores[0]
        feed(twin, np.random.default_rng(9), 12)  # diverge: wraps the ring, grows the flat store
        ahead = feed(session, np.random.default_rng(1), 4)
        check_oracle(prefix + ahead, TinyOracle(wts, windows=(3, 0)))
        replay(idle, ahead)  # the idle fork, fed the same tokens, is bitwise the original


def test_pickle_is_refused_and_names_fork(graphs):
    session = mlxgraph.load(graphs["mixed"][0]).session()
    with pytest.raises(TypeError, match=r"fork\(\)"):
        pickle.dumps(session)


# ------------------------------------------------------------------------ save / restore
@pytest.mark.parametrize(
    "policy", [{}, {"kv_dtype": "bfloat16", "preallocate": True}, {"windows": {0: 6, 1: 4}}]
)
def test_save_restore_continues_bitwise(graphs, tmp_path, policy):
    program = mlxgraph.load(graphs["mixed"][0])
    session = program.session(capacity=64, max_step=3, **policy)
    feed(session, np.random.default_rng(0), 9)  # the window-3 ring wraps
    session.trim(1)
    file = tmp_path / "c.safetensors"
    session.save(file)
    restored = program.restore(file)
    assert restored.length == session.length and restored.policy == session.policy
    assert [la["tokens"] for la in restored.describe()["layers"]] == [
        la["tokens"] for la in session.describe()["layers"]
    ]
    replay(restored, feed(session, np.random.default_rng(1), 8))


def test_restore_refusals_leave_the_session_unchanged(graphs, tmp_path):
    program = mlxgraph.load(graphs["mixed"][0])
    session = program.session(capacity=64, max_step=3)
    seed = 0
    while not 10 <= session.length <= 19:  # a two-digit length "1x" for the header edit
        session.reset()
        seed += 1
        feed(session, np.random.default_rng(seed), 5)
    good = tmp_path / "good.safetensors"
    session.save(good, tokens=list(range(session.length)))
    raw = good.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    other = mlxgraph.load(graphs["other"][0]).session(capacity=64, max_step=3)
    other.save(tmp_path / "other.safetensors")
    cases = {
        "another graph": (tmp_path / "other.safetensors", "saved from another graph"),
        "truncated": (raw[: len(raw) - 7], "truncated"),
        "tampered data": (raw[:-3] + bytes([raw[-3] ^ 1]) + raw[-2:], "SHA-256 seal"),
        "tampered header": (
            raw.replace(b'{\\"length\\": 1', b'{\\"length\\": 2', 1),
            "SHA-256 seal|malformed session header",
        ),
        "not a file": (b"\x00" * 3, "truncated"),
        "huge header": ((1 << 40).to_bytes(8, "little") + raw[8:], "over the"),
        "bad json": (raw[:8] + b"{" * header_len + raw[8 + header_len :], "not JSON"),
    }
    target = program.session(capacity=64, max_step=3)
    base = feed(target, np.random.default_rng(7), 4)
    probe = target.fork()
    ahead = feed(probe, np.random.default_rng(8), 3)
    assert cases["tampered header"][0] != raw
    for name, (data, message) in cases.items():
        path = data if not isinstance(data, bytes) else tmp_path / f"{name}.safetensors"
        if isinstance(data, bytes):
            path.write_bytes(data)
        with pytest.raises(CacheFileError, match=message):
            target.restore(path)
        with pytest.raises(CacheFileError, match=message):
            program.restore(path)
    policy_other = program.session(capacity=32, max_step=3)
    with pytest.raises(CacheFileError, match="another cache policy .*capacity"):
        policy_other.restore(good)
    assert target.length == sum(len(t) for t, _ in base)
    replay(target, ahead)  # untouched by every refusal


def test_saved_file_is_standard_safetensors(graphs, tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    program = mlxgraph.load(graphs["mixed"][0])
    session = program.session(capacity=64, max_step=3)
    feed(session, np.random.default_rng(0), 4)
    session.save(tmp_path / "c.safetensors", tokens=list(range(session.length)))
    arrays = st.load_file(str(tmp_path / "c.safetensors"))
    assert set(arrays) == {"layer.0.keys", "layer.0.values", "layer.1.keys", "layer.1.values"}
    flat = arrays["layer.1.keys"]
    assert flat.shape == (1, 2, session.length, 8) and flat.dtype == np.float32
    from safetensors import safe_open

    with safe_open(str(tmp_path / "c.safetensors"), "np") as f:
        doc = json.loads(f.metadata()["mlxgraph.session"])
    assert doc["tokens"] == list(range(session.length)) and doc["policy"]["capacity"] == 64


# ------------------------------------------------------------------------ quantized KV
@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A 2-layer Llama with head_dim 64 (quantizable in groups of 32 and 64)."""
    path = tmp_path_factory.mktemp("w") / "wide.mlxg"
    llama(layers=2, hidden=128, heads=2, kv_heads=1, intermediate=64, vocab=64).write(path)
    return mlxgraph.load(path)


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_kv_is_close_and_restores_bitwise(wide, tmp_path, bits):
    full = wide.session(capacity=128, max_step=4)
    quant = wide.session(capacity=128, max_step=4, kv_bits=bits, kv_group_size=32)
    ring = wide.session(capacity=128, max_step=4, kv_bits=bits, windows=8)  # ring stores
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(12):
        toks = rng.integers(0, 64, int(rng.choice([1, 3, 6])))[None].astype(np.int32)
        pos = range(full.length, full.length + toks.shape[1])
        a, b = np.array(full.step(mx.array(toks), pos)), np.array(quant.step(mx.array(toks), pos))
        ring.step(mx.array(toks), pos)
        worst = max(worst, np.abs(a - b).max() / np.abs(a).max())
    assert 0 < worst < (0.02 if bits == 8 else 0.2)
    layer = quant.describe()["layers"][0]
    assert layer["bits"] == bits and layer["dtype"] is None
    # bytes per token: (64 * bits / 32 words + 2 * 2 float32 groups) * 4 bytes, for k and v
    store = quant.stores[0]
    assert store.nbytes == store.describe()["allocated_slots"] * 2 * (64 * bits // 8 + 16)
    for session in (quant, ring):
        session.save(tmp_path / "q.safetensors")
        restored = wide.restore(tmp_path / "q.safetensors")
        replay(restored, feed(session, np.random.default_rng(2), 5, sizes=(1, 2)))


def test_kv_bits_a_store_cannot_honour_is_refused(graphs, wide):
    program = mlxgraph.load(graphs["mixed"][0])
    with pytest.raises(
        CacheError, match="head_dim 8 is not a multiple of the quantization group size 64"
    ):
        program.session(kv_bits=8)
    with pytest.raises(CacheError, match="kv_bits must be 0"):
        wide.session(kv_bits=3)
    with pytest.raises(CacheError, match="cannot also take kv_dtype"):
        wide.session(kv_bits=4, kv_dtype="float16")
    with pytest.raises(CacheError, match="group size must be|kv_group_size must be one of"):
        wide.session(kv_bits=4, kv_group_size=48)
