"""A session survives anything: interrupts mid-step, other threads, bad options, huge caches."""

import threading

import mlx.core as mx
import numpy as np
import pytest
from tiny_graph import VOCAB, TinyOracle, build_tiny_graph

import mlxgraph
from mlxgraph.interpreter.errors import SessionError
from mlxgraph.interpreter.kv_cache import CacheError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "tiny.mlxg"
    return path, build_tiny_graph(path)


def _matches(session, oracle, toks):
    start = session.length
    got = session.step(mx.array(np.array([toks], dtype=np.int32)), range(start, start + len(toks)))
    want = oracle.step(np.array(toks))
    got = np.array(got).reshape(want.shape)
    return np.abs(got - want).max() <= 2e-4 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_base_exception_mid_step_rolls_back(tiny, exc):
    path, wts = tiny
    session, oracle = mlxgraph.load(path).session(capacity=16), TinyOracle(wts)
    assert _matches(session, oracle, [1, 2, 3])

    def interrupt(index, record, outputs):
        if record.op == "LinearNode" and index > 10:  # after the attention node wrote its K/V
            raise exc()

    with pytest.raises(exc):
        session.step([[4, 5]], [3, 4], observer=interrupt)
    assert session.length == 3
    assert _matches(session, oracle, [4, 5])       # every store accepts the next step
    assert session.trim(2) == 3


def test_concurrent_step_is_refused_and_changes_nothing(tiny):
    path, wts = tiny
    session, oracle = mlxgraph.load(path).session(capacity=16), TinyOracle(wts)
    inside, release, errors = threading.Event(), threading.Event(), []

    def slow(index, record, outputs):
        if index == 0:
            inside.set()
            release.wait(30)

    worker = threading.Thread(target=lambda: mx.eval(session.step([[1]], [0], observer=slow)))
    worker.start()
    assert inside.wait(30)
    for call in (lambda: session.step([[2]], [0]), lambda: session.trim(0), session.reset):
        try:
            call()
        except SessionError as e:
            errors.append(str(e))
    release.set()
    worker.join(30)
    assert len(errors) == 3 and all("in use by another thread" in e for e in errors)
    assert session.length == 1
    oracle.step(np.array([1]))
    assert _matches(session, oracle, [2, 3])       # continued from the main thread


def test_unevaluated_step_from_another_thread_is_a_clear_error(tiny):
    path, wts = tiny
    session, oracle = mlxgraph.load(path).session(capacity=16), TinyOracle(wts)
    session.step([[1, 2]], [0, 1])                 # lazy: built on this thread's stream
    seen = []

    def other():
        try:
            session.step([[3]], [2])
        except SessionError as e:
            seen.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    t.join(30)
    assert seen and "built in another thread and is not evaluated" in seen[0]
    assert session.length == 2
    mx.eval(session.cache_state())
    oracle.step(np.array([1, 2]))
    result = []
    t = threading.Thread(target=lambda: result.append(_matches(session, oracle, [3])))
    t.start()
    t.join(30)
    assert result == [True]                        # evaluated: any thread may continue


@pytest.mark.parametrize("kwargs, match", [
    ({"capacity": 0}, "capacity must be an int"),
    ({"capacity": 2**31}, "capacity must be an int"),
    ({"capacity": 3.5}, "capacity must be an int"),
    ({"capacity": True}, "capacity must be an int"),
    ({"max_step": 0}, "max_step must be an int"),
    ({"windows": -1}, "window of layer 0 must be an int"),
    ({"windows": {0: 2.5}}, "window of layer 0 must be an int"),
    ({"windows": "4"}, "windows must be an int or"),
])
def test_bad_options_are_refused(tiny, kwargs, match):
    with pytest.raises(SessionError, match=match):
        mlxgraph.load(tiny[0]).session(**kwargs)


def test_preallocation_past_memory_is_refused(tiny):
    program = mlxgraph.load(tiny[0])
    with pytest.raises(CacheError, match="preallocate=True needs .* GiB"):
        program.session(capacity=2**31 - 1, preallocate=True)
    session = program.session(capacity=64, preallocate=True)
    mx.eval(session.step([[1, 2]], [0, 1]))


@pytest.mark.parametrize("positions", [[0.0], [0.9], [True], np.array([0.5])])
def test_non_integer_positions_are_refused(tiny, positions):
    session = mlxgraph.load(tiny[0]).session(capacity=8)
    with pytest.raises(SessionError, match="positions must be integers"):
        session.step([[1]], positions)
    assert session.length == 0


def test_bad_token_arrays_are_refused(tiny):
    session = mlxgraph.load(tiny[0]).session(capacity=8)
    for tokens in ([[1.5]], mx.array([[1.0]]), [[VOCAB]], [[-1]]):
        with pytest.raises(SessionError):
            session.step(tokens, [0])
    with pytest.raises(SessionError, match="trim needs an int"):
        session.trim(0.5)
    assert session.length == 0
