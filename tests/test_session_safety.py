"""A session survives anything: interrupts mid-step, other threads, bad options, huge caches."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from tiny_graph import VOCAB, TinyOracle, build_tiny_graph

import mlxgraph
from mlxgraph.interpreter.cache.kv_cache import CacheError
from mlxgraph.interpreter.errors import SessionError


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


def _in_thread(fn):
    """Run ``fn`` in a new thread that then ends; returns its result or raises its error."""
    box = []

    def run():
        try:
            box.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box.append((False, e))

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    ok, value = box[0]
    if not ok:
        raise value
    return value


def copy_of(oracle):
    twin = TinyOracle.__new__(TinyOracle)
    twin.__dict__.update(oracle.__dict__)
    return twin


def test_a_session_moves_between_threads_even_unevaluated(tiny):
    """A step never evaluated continues in another thread, alive or ended; a session last
    stepped in a thread that has ended takes reset, trim, fork, save and steps anywhere."""
    path, wts = tiny
    session, oracle = mlxgraph.load(path).session(capacity=16), TinyOracle(wts)
    session.step([[1, 2]], [0, 1])                 # lazy: built on this thread's stream
    oracle.step(np.array([1, 2]))
    assert _in_thread(lambda: _matches(session, oracle, [3]))
    _in_thread(lambda: session.step([[4, 5]], [3, 4]))  # lazy, and its thread ends
    oracle.step(np.array([4, 5]))
    assert _matches(session, oracle, [6])
    _in_thread(lambda: session.step([[7]], [6]))
    file = Path(os.environ.get("TMPDIR", "/tmp")) / f"moves-{os.getpid()}.safetensors"
    try:
        _in_thread(lambda: session.save(file))
        restored = _in_thread(lambda: mlxgraph.load(path).restore(file))  # its thread ends
        _in_thread(lambda: session.restore(file))
    finally:
        file.unlink(missing_ok=True)
    oracle.step(np.array([7]))
    probe = copy_of(oracle)
    assert _matches(restored, probe, [8])
    twin = session.fork()
    assert session.trim(1) == 6 and twin.length == 7
    session.reset()
    assert session.length == 0 and _matches(mlxgraph.load(path).session(capacity=16),
                                            TinyOracle(wts), [1])


def test_a_lazy_bad_token_poisons_the_next_step_and_fails_the_one_after(tiny):
    """Steps after a lazy out-of-vocabulary token id, even steps without lazy tokens of
    their own: the next one's outputs are NaN (its history holds the bad token), the one
    after raises and rewinds; describe and save raise at once; any thread."""
    path, wts = tiny
    program = mlxgraph.load(path)
    for where in (lambda f: f(), _in_thread):
        session, oracle = program.session(capacity=16), TinyOracle(wts)
        assert _matches(session, oracle, [1])
        where(lambda s=session: s.step(mx.array([[2, VOCAB + 5]]), [1, 2]))
        assert np.isnan(np.array(session.step([[3]], [3]))).all()
        with pytest.raises(SessionError, match="token id outside the vocabulary .* rewound "
                                               "to position 1"):
            session.step([[4]], [4])
        assert session.length == 1 and _matches(session, oracle, [2])
        for read in (session.describe, lambda s=session: s.save(os.devnull + "-never")):
            session.step(mx.array([[VOCAB]]), [session.length])
            with pytest.raises(SessionError, match="outside the vocabulary"):
                read()
        assert session.length == 2


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


RACE_WORKER = Path(__file__).with_name("session_race_worker.py")


def _race(tmp_path, seconds):
    res = subprocess.run([sys.executable, str(RACE_WORKER), str(tmp_path), str(seconds)],
                         capture_output=True, text=True, timeout=120 + 3 * seconds)
    assert res.returncode == 0, f"exit {res.returncode}: {res.stderr[-2000:]}"
    result = json.loads(res.stdout.strip().splitlines()[-1])
    print(json.dumps(result))
    for phase in ("phase1", "phase2"):
        assert not result[phase]["errors"], result[phase]["errors"]
        assert result[phase]["calls"] > 20
    assert result["phase1"]["compared"] > 10
    return result


def test_two_threads_racing_on_one_session(tmp_path):
    """Steps, forks, saves, trims, resets and batched steps from two threads, outputs
    evaluated by their threads at once, later or asynchronously: no crash (the worker is
    a subprocess), SessionErrors only, every evaluated output equal to the oracle's."""
    _race(tmp_path, 2)


@pytest.mark.slow
def test_two_threads_racing_on_one_session_for_10_s_each(tmp_path):
    _race(tmp_path, 20)
