"""The server's kept sessions (tools/serve/prefix_cache.py): a fork of the longest shared
prefix, rewound to it, computes what a fresh session fed the whole prompt computes; the kept
session is not changed by its forks; prefixes of a newer entry are dropped; the memory
budget evicts the least recently used first."""

import mlx.core as mx
import numpy as np
import pytest
from tool_helpers import synthetic_graph

import mlxgraph
from mlxgraph.tools.serve.prefix_cache import PrefixCache, cache_bytes


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return mlxgraph.load(synthetic_graph(tmp_path_factory.mktemp("cache") / "g.mlxg"))


def _fed(program, ids):
    session = program.session(capacity=128)
    session.step(mx.array([ids], dtype=mx.int32), range(len(ids)))
    mx.eval(*session.cache_state())
    return session


def _next_logits(session, ids):
    start = session.length
    out = session.step(mx.array([ids[start:]], dtype=mx.int32), range(start, len(ids)))
    return np.array(out[0, -1])


def test_a_fork_of_the_shared_prefix_computes_the_fresh_answer(program):
    cache = PrefixCache(1 << 30)
    kept_ids = [5, 6, 7, 8, 9, 10]
    kept = _fed(program, kept_ids)
    assert cache.put(kept_ids, kept)
    ids = [5, 6, 7, 8, 20, 21, 22]
    fork, n = cache.take(ids)
    assert n == 4 and fork.length == 4
    np.testing.assert_allclose(_next_logits(fork, ids),
                               _next_logits(program.session(capacity=128), ids), atol=1e-5)
    assert kept.length == len(kept_ids)  # the kept session is untouched by its fork
    fork2, n2 = cache.take(kept_ids)
    assert n2 == len(kept_ids) - 1  # the last id is always fed again (its logits are needed)
    np.testing.assert_allclose(_next_logits(fork2, kept_ids),
                               _next_logits(program.session(capacity=128), kept_ids), atol=1e-5)
    assert cache.take([99, 5, 6]) == (None, 0)


def test_prefixes_are_dropped_and_the_budget_evicts_the_oldest(program):
    a = _fed(program, [1, 2, 3])
    size = cache_bytes(a)
    cache = PrefixCache(2 * size)
    cache.put([1, 2, 3], a)
    cache.put([1, 2, 3, 4], _fed(program, [1, 2, 3, 4]))
    assert len(cache) == 1  # [1, 2, 3] is a prefix of [1, 2, 3, 4]
    cache.put([7, 8], _fed(program, [7, 8]))
    cache.take([1, 2, 3, 4, 5])  # [1, 2, 3, 4] becomes the most recently used
    cache.put([9, 9], _fed(program, [9, 9]))
    assert len(cache) == 2 and cache.bytes <= 2 * size
    assert cache.take([7, 8, 1])[0] is None  # the least recently used went first
    assert cache.take([1, 2, 3, 4, 6])[1] == 4
    assert not PrefixCache(0).put([1, 2], _fed(program, [1, 2]))


def test_a_recurrent_state_model_reuses_the_prefixes_its_snapshots_hold(tmp_path):
    """A state cannot be sliced back: the kept session is rewound to the longest shared
    prefix one of its snapshots holds (a step's start), and computes the fresh answer."""
    from state_graphs import build_state_graph

    build_state_graph(tmp_path / "s.mlxg")
    program = mlxgraph.load(tmp_path / "s.mlxg")
    kept_ids = [3, 4, 5, 6, 7, 8, 9, 10, 11]
    kept = program.session(capacity=64)
    kept.step(mx.array([kept_ids[:6]], dtype=mx.int32), range(6))  # a prefill of 6
    for i in range(6, 9):                                            # three decode steps
        kept.step(mx.array([[kept_ids[i]]], dtype=mx.int32), [i])
    mx.eval(*kept.cache_state())
    assert [kept.rewind_target(n) for n in (9, 8, 7, 6, 5, 1)] == [9, 8, 7, 6, 0, 0]
    cache = PrefixCache(1 << 30)
    assert cache.put(kept_ids, kept)
    for shared in (8, 7, 6):
        ids = kept_ids[:shared] + [20, 21]
        fork, n = cache.take(ids)
        assert n == shared and fork.length == shared
        np.testing.assert_allclose(_next_logits(fork, ids),
                                   _next_logits(program.session(capacity=64), ids), atol=1e-5)
    # Shared 5 tokens: no snapshot at 5 (the prefill's steps are 0..5), so nothing is reused.
    assert cache.take(kept_ids[:5] + [30, 31]) == (None, 0)
    assert kept.length == len(kept_ids)
