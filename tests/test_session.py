"""Program and Session against a dense numpy oracle: many steps, sessions, rejections."""

import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from tiny_graph import VOCAB, TinyOracle, build_tiny_graph

import mlxgraph
from mlxgraph.interpreter.cache.kv_cache import CacheError
from mlxgraph.interpreter.errors import GraphRuntimeError, SessionError
from mlxgraph.schema.errors import GraphFormatError

TOL = 2e-4  # float32 graph vs float64 oracle, relative to the logits' scale


def close(got, want):
    got = np.array(got.astype(mx.float32)).reshape(want.shape)
    return np.abs(got - want).max() <= TOL * max(1.0, np.abs(want).max())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "tiny.mlxg"
    return path, build_tiny_graph(path)


def run_schedule(session, oracle, rng, steps):
    for _ in range(steps):
        n = int(rng.choice([1, 1, 1, 2, 3, 5]))
        toks = rng.integers(0, VOCAB, n)
        pos = range(session.length, session.length + n)
        got = session.step(mx.array(toks[None].astype(np.int32)), pos)
        assert close(got, oracle.step(toks))


def test_steps_match_dense_oracle(tiny):
    path, wts = tiny
    program = mlxgraph.load(path)
    for policy in ({}, {"preallocate": True}, {"kv_dtype": "float32", "max_step": 2}):
        session = program.session(capacity=64, **policy)
        oracle = TinyOracle(wts)
        run_schedule(session, oracle, np.random.default_rng(1), 30)


def test_sliding_window_override_matches_windowed_oracle(tiny):
    path, wts = tiny
    session = mlxgraph.load(path).session(capacity=64, windows={0: 4}, max_step=3)
    run_schedule(session, TinyOracle(wts, windows=(4,)), np.random.default_rng(2), 30)


def test_attention_layer_without_cache_geometry_is_rejected(tmp_path):
    path = tmp_path / "nometa.mlxg"
    build_tiny_graph(path, record_layers=False)
    with pytest.raises(
        GraphFormatError,
        match=r"node \d+: field UpdateAndAttend\.layer_id: layer_id 0 has no cache geometry",
    ):
        mlxgraph.load(path)


def test_two_sessions_interleaved_equal_each_alone(tiny):
    path, _ = tiny
    program = mlxgraph.load(path)
    rng = np.random.default_rng(3)
    plans = [[rng.integers(0, VOCAB, int(rng.integers(1, 4))) for _ in range(12)] for _ in range(2)]

    def run(session, toks):
        out = session.step(
            mx.array(toks[None].astype(np.int32)), range(session.length, session.length + len(toks))
        )
        return np.array(out)

    alone = [
        [run(s, t) for t in plan] for s, plan in ((program.session(capacity=64), p) for p in plans)
    ]
    a, b = program.session(capacity=64), program.session(capacity=64)
    mixed = [[], []]
    for ta, tb in zip(*plans):
        mixed[0].append(run(a, ta))
        mixed[1].append(run(b, tb))
    for want, got in zip(alone, mixed):
        for x, y in zip(want, got):
            assert np.array_equal(x, y)


def test_rejected_steps_leave_the_session_unchanged(tiny):
    path, wts = tiny
    session = mlxgraph.load(path).session(capacity=20)
    oracle = TinyOracle(wts)
    rng = np.random.default_rng(4)
    run_schedule(session, oracle, rng, 3)
    length = session.length
    toks = mx.array([[1, 2]], dtype=mx.int32)
    with pytest.raises(SessionError, match="positions"):
        session.step(toks, [length + 1, length + 2])
    with pytest.raises(SessionError, match="at least one"):
        session.step(mx.zeros((1, 0), dtype=mx.int32), [])
    with pytest.raises(CacheError, match="exceeds the capacity of 20"):
        session.step(mx.zeros((1, 21 - length), dtype=mx.int32), range(length, 21))
    with pytest.raises(SessionError, match="bounds"):
        session.step(mx.zeros((1, 65), dtype=mx.int32), range(length, length + 65))
    with pytest.raises(SessionError, match=f"token id {VOCAB} is outside the vocabulary"):
        session.step(np.array([[1, VOCAB]]), range(length, length + 2))
    with pytest.raises(SessionError, match="integers"):
        session.step(np.array([[1.5]]), [length])
    assert session.length == length
    toks = rng.integers(0, VOCAB, 2)
    assert close(
        session.step(mx.array(toks[None].astype(np.int32)), range(length, length + 2)),
        oracle.step(toks),
    )


def test_failed_node_names_node_and_keeps_cache(tmp_path):
    path = tmp_path / "fails.mlxg"
    wts = build_tiny_graph(path, fail_unless_t=1)
    session = mlxgraph.load(path).session(capacity=32)
    oracle = TinyOracle(wts)
    assert close(session.step(mx.array([[3]], dtype=mx.int32), [0]), oracle.step(np.array([3])))
    with pytest.raises(GraphRuntimeError, match=r"node \d+ \(Reshape\)"):
        session.step(mx.array([[4, 5]], dtype=mx.int32), [1, 2])
    assert session.length == 1
    assert close(session.step(mx.array([[6]], dtype=mx.int32), [1]), oracle.step(np.array([6])))


def test_cache_geometry_disagreeing_with_the_graph_names_file_and_node(tmp_path):
    path = tmp_path / "badgeo.mlxg"
    build_tiny_graph(path, recorded_kv_heads=1)   # the graph's K/V have 2 heads
    session = mlxgraph.load(path).session(capacity=8)
    with pytest.raises(
        CacheError, match=r"badgeo\.mlxg: node \d+ \(UpdateAndAttend\): layer 0 .*expected k"
    ):
        session.step(mx.array([[1, 2]], dtype=mx.int32), [0, 1])
    assert session.length == 0


def test_bad_session_overrides_are_clear_errors(tiny):
    path, _ = tiny
    program = mlxgraph.load(path)
    with pytest.raises(SessionError, match="kv_dtype 'float8' is not a dtype name"):
        program.session(kv_dtype="float8")
    with pytest.raises(CacheError, match="kv_dtype must be"):
        program.session(kv_dtype="int8")
    with pytest.raises(SessionError, match="windows names layers \\[7\\]"):
        program.session(windows={7: 4})
    with pytest.raises(SessionError, match="capacity must be an int in \\[1, "):
        program.session(capacity=-1)


def test_trim_and_reset(tiny):
    path, wts = tiny
    session = mlxgraph.load(path).session(capacity=64)
    oracle = TinyOracle(wts)
    rng = np.random.default_rng(5)
    run_schedule(session, oracle, rng, 8)
    n = session.length // 2
    session.trim(n)
    oracle.trim(n)
    run_schedule(session, oracle, rng, 5)
    with pytest.raises(SessionError):
        session.trim(session.length + 1)
    session.reset()
    assert session.length == 0
    run_schedule(session, TinyOracle(wts), rng, 5)


def test_observer_sees_every_node(tiny):
    path, _ = tiny
    program = mlxgraph.load(path)
    seen = []
    program.session(capacity=8).step(
        mx.array([[1, 2]], dtype=mx.int32),
        [0, 1],
        observer=lambda i, rec, outs: seen.append((i, rec.op, outs[0].shape)),
    )
    assert [s[0] for s in seen] == list(range(len(program.nodes)))
    assert seen[-1][2] == (1, 2, VOCAB)


def test_interpreter_runs_without_torch(tiny):
    path, _ = tiny
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import mlx.core as mx, mlxgraph\n"
        f"s = mlxgraph.load({str(path)!r}).session(capacity=8)\n"
        "out = s.step(mx.array([[1, 2]], dtype=mx.int32), [0, 1]); mx.eval(out)\n"
        "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules if "
        "sys.modules[m] is not None)\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_mixed_policies_reject_overflow_and_stay_usable(tmp_path):
    # Layer 0 is a ring (window 3), layer 1 flat: the ring accepts a step the flat layer
    # refuses, and must not be left half-open by the rejection.
    path = tmp_path / "mixed.mlxg"
    wts = build_tiny_graph(path, windows=(3, 0))
    session = mlxgraph.load(path).session(capacity=12, max_step=2)
    oracle = TinyOracle(wts, windows=(3, 0))
    rng = np.random.default_rng(6)
    run_schedule(session, oracle, rng, 4)
    with pytest.raises(CacheError):
        session.step(mx.zeros((1, 13 - session.length), dtype=mx.int32), range(session.length, 13))
    for _ in range(3):
        toks = rng.integers(0, VOCAB, 1)
        assert close(
            session.step(mx.array(toks[None].astype(np.int32)), [session.length]), oracle.step(toks)
        )


def test_package_exports_error_types_without_importing_mlx():
    code = (
        "import sys, mlxgraph\n"
        "assert 'mlx.core' not in sys.modules and 'torch' not in sys.modules\n"
        "from mlxgraph.interpreter.errors import SessionError\n"
        "assert mlxgraph.SessionError is SessionError and issubclass(mlxgraph.CacheError, "
        "ValueError)\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
