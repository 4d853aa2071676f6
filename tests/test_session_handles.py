"""A session never holds an MLX array that what it hands out also holds (session/lock.py).

Two threads waiting on one queued MLX array race inside MLX (one clears the array's event
while the other tests it: SIGSEGV in Event::is_signaled, seen in session_race_worker.py
about once in 40 runs). Whether it crashes is timing; whether an array is shared is not:
``mx.export_to_dot`` names each array once, so an array of the session's that a step's
outputs read shows an edge, and one that a caller also holds loses one of its two names.
"""

import mlx.core as mx
import numpy as np
import pytest
from state_graphs import build_state_graph
from synthetic_graphs import llama
from tiny_graph import build_tiny_graph

import mlxgraph


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "tiny.mlxg"
    build_tiny_graph(path, max_t=8)
    return mlxgraph.load(path)


def _kept(session) -> list:
    """Every array the session holds: its stores' buffers, recurrent states' snapshots and
    pending index flags."""
    stores = session.stores.values()
    return ([a for s in stores for a in s.state] + session._pending.unread()
            + [a for s in stores for _, a in getattr(s, "_snapshots", ()) if a is not None])


def _shared(theirs, ours, tmp_path) -> list:
    """The names of ``ours`` that are arrays of ``theirs`` or read by their graphs."""
    dot = tmp_path / "graph.dot"
    mx.export_to_dot(str(dot), **{f"theirs{i}": a for i, a in enumerate(theirs)},
                     **{f"ours{i}": a for i, a in enumerate(ours)})
    text = dot.read_text()
    lost = [f"theirs{i}" for i in range(len(theirs)) if f'"theirs{i}"' not in text]
    read = [f"ours{i}" for i in range(len(ours)) if f'"ours{i}" ->' in text]
    return lost + read


def test_a_steps_outputs_hold_no_array_of_the_session(program, tmp_path):
    """Outputs poisoned by lazy-token flags, read over the committed cache, a step after
    another: the session keeps handles of what they read."""
    session = program.session(capacity=16, max_step=4)
    first = session.step(mx.array([[1, 2]]), [0, 1])    # lazy tokens: a flag to keep
    second = session.step(mx.array([[3]]), [2])        # poisoned by the first's flag too
    assert len(session._pending.unread()) == 2
    assert _shared([first, second], _kept(session), tmp_path) == []
    assert np.isfinite(np.array(first)).all() and np.isfinite(np.array(second)).all()


def test_fork_and_cache_state_hand_out_handles_not_the_sessions_arrays(program, tmp_path):
    session = program.session(capacity=16, max_step=4)
    out = session.step(mx.array([[1, 2]]), [0, 1])
    twin = session.fork()
    assert _shared(_kept(twin) + [out], _kept(session), tmp_path) == []
    assert _shared(session.cache_state(), _kept(session), tmp_path) == []
    assert np.array_equal(np.array(twin.step([[4]], [2])), np.array(session.step([[4]], [2])))


def test_a_recurrent_states_snapshots_are_its_own(tmp_path):
    """A step's outputs read the state the newest snapshot keeps; a fork takes handles of
    the state and every snapshot."""
    build_state_graph(tmp_path / "state.mlxg")
    session = mlxgraph.load(tmp_path / "state.mlxg").session(capacity=16, state_snapshots=4)
    outs = [session.step([[t]], [t]) for t in range(3)]
    assert len(_kept(session)) == 3    # the state and the two snapshots before it
    assert _shared(outs, _kept(session), tmp_path) == []
    assert _shared(_kept(session.fork()), _kept(session), tmp_path) == []


def test_a_batched_steps_outputs_hold_no_array_of_its_sessions(program, tmp_path):
    a = program.session(capacity=16, max_step=4)
    b = program.session(capacity=16, max_step=4)
    outs = program.step_batch([(a, mx.array([[1]]), [0]), (b, mx.array([[2, 3]]), [0, 1])])
    assert _shared(outs + _kept(b), _kept(a), tmp_path) == []
    assert _shared(outs, _kept(b), tmp_path) == []


def test_a_batched_steps_rows_are_queued_arrays_of_their_own(program, tmp_path):
    """The rows are cuts of one packed graph: two threads evaluating two rows would both
    wait on its arrays (SIGSEGV in every run of 2000 such steps). Queued before step_batch
    returns, each row has no graph left to share."""
    a = program.session(capacity=16, max_step=4)
    b = program.session(capacity=16, max_step=4)
    rows = program.step_batch([(a, mx.array([[1]]), [0]), (b, mx.array([[2, 3]]), [0, 1])])
    dot = tmp_path / "rows.dot"
    mx.export_to_dot(str(dot), **{f"row{i}": r for i, r in enumerate(rows)})
    assert "->" not in dot.read_text()
    alone = program.session(capacity=16, max_step=4).step(mx.array([[2, 3]]), [0, 1])
    assert np.allclose(np.array(rows[1]), np.array(alone), atol=1e-5)


def test_a_programs_constants_are_computed_at_load(tmp_path):
    """Widened weights are lazy casts: computed at load, never first queued by one
    thread's step and then waited on by every other's."""
    path = tmp_path / "f16.mlxg"
    llama(dtype="float16").write(path)
    program = mlxgraph.load(path, compute_dtype="float32")
    assert program.widened_from == ("float16",)
    dot = tmp_path / "constants.dot"
    mx.export_to_dot(str(dot), **{f"c{i}": c for i, c in enumerate(program.constants.values())})
    assert "->" not in dot.read_text()
