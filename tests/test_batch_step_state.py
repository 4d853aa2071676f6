"""Batched steps and session state: rows' token dtypes, rollback of every session on an
interrupt or a kernel failure mid-step, forks of one session stepped together, quantized
and ring stores in one batch, and the server's fallback when a batch is refused."""

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from synthetic_graphs import llama
from tiny_graph import VOCAB, build_tiny_graph
from token_mix_graphs import mix_graph

import mlxgraph
from mlxgraph.tools.serve.stepping import Stepper


def _same(got, want, tol=1e-5):
    got, want = np.array(got), np.array(want)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= tol * max(1.0, np.abs(want).max())


def _row(session, toks):
    """(session, tokens [1, n], positions) for host ids ``toks`` at the session's end."""
    ids = mx.array([[int(t) for t in toks]], dtype=mx.int32)
    return session, ids, range(session.length, session.length + len(toks))


def _step(session, toks):
    """One solo step of host ids ``toks`` at the session's end."""
    return session.step(*_row(session, toks)[1:])


@pytest.fixture(scope="module")
def llama_program(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "llama.mlxg"
    llama(layers=2, hidden=64, heads=2, kv_heads=1, vocab=512).write(path)
    return mlxgraph.load(path)


def test_rows_keep_their_token_ids_whatever_their_dtypes(llama_program):
    """Rows are packed in the graph's token dtype, not the first row's: a uint8 row first
    must not wrap the next row's id 300."""
    p = llama_program
    assert p.batching.problem is None
    rows = [np.array([[5]], dtype=np.uint8), np.array([[300, 7]], dtype=np.int64),
            mx.array([[100]], dtype=mx.uint8), mx.array([[120, 3]], dtype=mx.int8)]
    solo = [p.session().step(t, range(t.shape[1])) for t in rows]
    got = p.step_batch([(p.session(), t, range(t.shape[1])) for t in rows])
    for g, w in zip(got, solo):
        _same(g, w)
    _same(solo[2], p.session().step([[100]], [0]))


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_a_failure_mid_step_leaves_every_session_as_it_was(tmp_path, exc):
    """An exception after attention staged each row's K/V, and every session is as before:
    same lengths, and the next steps equal a twin that never saw the failed batch."""
    path = tmp_path / "tiny.mlxg"
    build_tiny_graph(path, windows=(3, 0))
    p = mlxgraph.load(path)
    opts = [{"capacity": 16}, {"windows": 4, "max_step": 1}, {"preallocate": True}]
    batched, twins = [p.session(**o) for o in opts], [p.session(**o) for o in opts]
    for s in batched + twins:
        mx.eval(_step(s, [1, 2, 3]))

    def interrupt(index, record, outputs):
        if index > 10:  # after the attention nodes staged their writes
            raise exc("stop")

    rows = [_row(s, t) for s, t in zip(batched, ([4], [5, 6], [7]))]
    with pytest.raises(exc):
        p.step_batch(rows, observer=interrupt)
    assert [s.length for s in batched] == [3, 3, 3]
    for toks in ([4, 5, 6], [7], [8, 9]):
        for s, t in zip(batched, twins):
            _same(_step(s, toks), _step(t, toks), 1e-6)


def test_forks_of_one_session_stepped_together_stay_apart(tmp_path):
    """A session and two forks (their stores share buffers) in one batch, many steps,
    static stores written in place: each equals its own solo twin."""
    path = tmp_path / "tiny.mlxg"
    build_tiny_graph(path, windows=(3, 0))
    p = mlxgraph.load(path)
    root, twin = p.session(preallocate=True, capacity=32), p.session(preallocate=True, capacity=32)
    for s in (root, twin):
        mx.eval(_step(s, [1, 2, 3, 4]))
    batched, solo = [root, root.fork(), root.fork()], [twin, twin.fork(), twin.fork()]
    rng = np.random.default_rng(3)
    for _ in range(6):
        toks = [list(rng.integers(0, VOCAB, int(rng.integers(1, 3)))) for _ in batched]
        got = p.step_batch([_row(s, t) for s, t in zip(batched, toks)])
        mx.eval(got)
        for g, s, t in zip(got, solo, toks):
            _same(g, _step(s, t))


def test_quantized_ring_and_flat_stores_in_one_batch(llama_program):
    p = llama_program
    opts = [{"kv_bits": 8, "kv_group_size": 32}, {"kv_bits": 4, "kv_group_size": 32,
            "windows": 5, "max_step": 2}, {"windows": 6, "max_step": 1}, {"kv_dtype": "float16"}]
    batched, solo = [p.session(**o) for o in opts], [p.session(**o) for o in opts]
    rng = np.random.default_rng(5)
    for _ in range(8):
        toks = [list(rng.integers(0, 512, int(rng.integers(1, 4)))) for _ in batched]
        got = p.step_batch([_row(s, t) for s, t in zip(batched, toks)])
        for g, s, t in zip(got, solo, toks):
            _same(g, _step(s, t))


def test_server_fallback_ends_the_job_whose_session_a_refused_batch_rewound(tmp_path):
    """A decode row fed a lazy token outside the vocabulary: two steps later its check fails
    inside the batched step, which rewinds that session and refuses the batch. The job
    must end with that error (as its own step would), not step again at the rewound
    position; the other job goes on."""
    path = tmp_path / "tiny.mlxg"
    build_tiny_graph(path)
    p = mlxgraph.load(path)
    jobs = [SimpleNamespace(session=p.session()) for _ in range(2)]
    for j in jobs:
        mx.eval(_step(j.session, [1, 2]))
    stepper = Stepper(chunk=4)
    for bad in (VOCAB + 5, 3, 4):
        jobs[0].y, jobs[1].y = mx.array([bad]), mx.array([5])
        done = stepper._decode_logits(jobs)
        mx.eval([out for _, out in done if not isinstance(out, Exception)])
    (_, first), (_, second) = done
    assert isinstance(first, mlxgraph.SessionError) and "outside the vocabulary" in str(first)
    assert jobs[0].session.length == 2
    assert not isinstance(second, Exception) and jobs[1].session.length == 5
    assert stepper.counters["batch_fallbacks"] == 1


def test_a_bad_lazy_token_fails_the_forks_and_the_save_of_its_history(tmp_path):
    """A batched row fed a lazy id outside the vocabulary (clamped, flagged): a fork taken
    before the flag is read shares that history, so it fails too; a save refuses it (a
    restored file would carry it with no check at all)."""
    path = tmp_path / "tiny.mlxg"
    build_tiny_graph(path)
    p = mlxgraph.load(path)
    a, b = p.session(), p.session()
    mx.eval(p.step_batch([_row(a, [1, 2]), _row(b, [3])]))
    p.step_batch([(a, mx.array([[VOCAB + 5]]), [2]), _row(b, [4])])
    fork = a.fork()
    for s in (fork, a):
        with pytest.raises(mlxgraph.SessionError, match="outside the vocabulary"):
            s.check()
        assert s.length == 2
    p.step_batch([(a, mx.array([[VOCAB + 1]]), [2]), _row(b, [5])])
    with pytest.raises(mlxgraph.SessionError, match="outside the vocabulary"):
        a.save(tmp_path / "a.cache")
    assert a.length == 2 and not (tmp_path / "a.cache").exists()
    b.check()
    assert b.save(tmp_path / "b.cache") > 0


def _token_index(g, x, t_val):  # each token's id indexes an 8-entry table: ids >= 8 are bad
    idx = g.tensor("idx", "int32", ("T", 1))
    g.node("Reshape", x=g.inputs[0][1], out=idx, shape=[-1, 1])
    table = g.const("table", np.arange(8, dtype=np.float32).reshape(1, 8))
    got = g.tensor("got", "float32", ("T", 1))
    g.node("Gather", x=table, indices=idx, axis=1, out=got)
    col = g.tensor("col", "float32", (1, "T", 1))
    g.node("Reshape", x=got, out=col, shape=[1, -1, 1])
    y = g.tensor("y", "float32", (1, "T", 8))
    g.node("Add", a=x, b=col, out=y)
    return y


def test_an_index_out_of_range_in_one_row_fails_that_row_only(tmp_path):
    """A gather's computed index outside its table (clamped, flagged lazily) in one row:
    that row's logits are NaN and its session is rewound at its next check, as alone;
    the other rows keep their exact logits and their step."""
    p = mix_graph(tmp_path, _token_index)
    assert p.batching.problem is None
    a, b, c = p.session(), p.session(), p.session()
    got = p.step_batch([(a, [[1, 2]], range(2)), (b, [[3, 12]], range(2)), (c, [[5]], [0])])
    for out, toks in zip(got, ([[1, 2]], None, [[5]])):
        if toks is None:
            assert np.isnan(np.array(out)).all()
        else:
            _same(out, p.session().step(toks, range(len(toks[0]))), 1e-6)
    for s in (a, c):
        s.check()
    with pytest.raises(mlxgraph.GraphRuntimeError, match="outside its table"):
        b.check()
    assert (a.length, b.length, c.length) == (2, 0, 1)
