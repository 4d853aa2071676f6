"""Random session schedules with fork and save/restore at random points, against the dense
oracle and, bitwise, against the uninterrupted session (tests/test_session_state.py has
the targeted checks)."""

import mlx.core as mx
import numpy as np
import pytest
from tiny_graph import VOCAB, TinyOracle, build_tiny_graph

import mlxgraph
from mlxgraph.interpreter.cache.kv_cache import CacheError

TOL = 2e-4


def replay(session, fed):
    """Feed ``fed``'s tokens again; the logits must be bitwise what ``fed`` recorded."""
    for toks, want in fed:
        pos = range(session.length, session.length + len(toks))
        got = session.step(mx.array(toks[None].astype(np.int32)), pos)
        np.testing.assert_array_equal(np.array(got), want)


def test_random_session_schedules_fork_and_restore_at_random_points(tmp_path):
    """Random schedules (chunks, decode, trims within and beyond a wrapped ring's reach,
    resets, rejected steps, capacity overflow); at random points a fork diverges and a
    save/restore replaces the session. Every committed step matches the dense oracle; the
    forked and restored sessions match the uninterrupted one bitwise on the same tokens."""
    path = tmp_path / "mixed.mlxg"
    wts = build_tiny_graph(path, windows=(3, 0))  # a sliding-3 ring layer and a flat layer
    program = mlxgraph.load(path)
    file = tmp_path / "s.safetensors"
    counts = {"fork": 0, "restore": 0, "rejected": 0}

    def step(session, oracle, toks):
        logits = session.step(
            mx.array(toks[None].astype(np.int32)), range(session.length, session.length + len(toks))
        )
        got = np.array(logits)
        want = oracle.step(toks)
        assert np.abs(got.reshape(want.shape) - want).max() <= TOL * max(1.0, np.abs(want).max())
        return got

    for seed in range(3):
        rng = np.random.default_rng(100 + seed)
        session, oracle = program.session(capacity=40, max_step=2), TinyOracle(wts, windows=(3, 0))
        for _ in range(45):
            r = rng.random()
            toks = rng.integers(0, VOCAB, int(rng.choice([1, 1, 2, 3, 5])))
            if r < 0.5:
                if session.length + len(toks) > 40:
                    with pytest.raises(CacheError, match="capacity"):
                        session.step(
                            mx.array(toks[None].astype(np.int32)),
                            range(session.length, session.length + len(toks)),
                        )
                    counts["rejected"] += 1
                else:
                    step(session, oracle, toks)
            elif r < 0.62:
                n = int(rng.integers(0, 4))
                if n <= min(s.max_trim for s in session.stores.values()):
                    session.trim(n)
                    oracle.trim(n)
                else:
                    refused = (CacheError, mlxgraph.SessionError)
                    with pytest.raises(refused, match="at most|between 0"):
                        session.trim(n)
                    counts["rejected"] += 1
            elif r < 0.67:
                with pytest.raises(mlxgraph.SessionError, match="positions"):
                    session.step(mx.array([[1]], dtype=mx.int32), [session.length + 1])
                counts["rejected"] += 1
            elif r < 0.7:
                session.reset()
                oracle = TinyOracle(wts, windows=(3, 0))
            elif session.length + 2 * len(toks) > 40:
                continue
            elif r < 0.85:
                twin, idle = session.fork(), session.fork()
                for _ in range(3):
                    if twin.length + 3 <= 40:
                        twin.step(
                            mx.array(rng.integers(0, VOCAB, (1, 3)).astype(np.int32)),
                            range(twin.length, twin.length + 3),
                        )
                replay(idle, [(toks, step(session, oracle, toks))])
                counts["fork"] += 1
            else:
                session.save(file)
                restored = program.restore(file)
                replay(restored, [(toks, step(session, oracle, toks))])
                session = restored
                counts["restore"] += 1
    assert min(counts.values()) >= 3, counts
