"""The token-row analysis (interpreter/batching/token_rows.py) against graphs that pass per-op rules
at one probe size yet let rows meet: a squeeze that drops a one-token row's token axis, a
literal size equal to the probe's token count, a gather cutting a table by the step's
token count, an Addmm bias with one row per probe token. Each is refused with its node;
forced to batch anyway, some row differs from its solo run (or runs where solo fails)."""

import re

import mlx.core as mx
import numpy as np
import pytest
from token_mix_graphs import mix_graph

import mlxgraph
from mlxgraph.interpreter.batching.token_rows import Batching


def _squeeze_all(g, x, t_val):  # squeezes every size-1 axis: the token axis of a 1-token step
    r = g.tensor("r", "float32", (1, "T", 2, 4))
    g.node("Reshape", x=x, out=r, shape=[1, t_val, 2, 4])
    s = g.tensor("s", "float32", ("T", 2, 4))
    g.node("Squeeze", x=r, out=s)
    m = g.tensor("m", "float32", ("T", 2, 4))
    g.node("Softmax", x=s, out=m, axis=1)  # the 2-axis, or the 4-axis once T is squeezed
    y = g.tensor("y", "float32", (1, "T", 8))
    g.node("Reshape", x=m, out=y, shape=[1, -1, 8])
    return y


def _literal_seven(g, x, t_val):  # [-1, 7, 8]: a step of 7 tokens is [1, 7, 8], of 14 [2, 7, 8]
    r = g.tensor("r", "float32", (None, 7, 8))
    g.node("Reshape", x=x, out=r, shape=[-1, 7, 8])
    s = g.tensor("s", "float32", (None, 7, 8))
    g.node("Softmax", x=r, out=s, axis=0)
    y = g.tensor("y", "float32", (1, "T", 8))
    g.node("Reshape", x=s, out=y, shape=[1, -1, 8])
    return y


def _table_cut(g, x, t_val):  # take-along-axis cuts the table to the step's T rows
    tokens = g.inputs[0][1]
    idx = g.tensor("idx", "int32", ("T", 1))
    g.node("Reshape", x=tokens, out=idx, shape=[-1, 1])
    table = g.const("table", np.arange(256, dtype=np.float32).reshape(32, 8))
    got = g.tensor("got", "float32", ("T", 1))
    g.node("Gather", x=table, indices=idx, axis=1, out=got)
    e = g.tensor("e", "float32", ("T", 8))
    g.node("Expand", x=got, out=e, shape=[t_val, 8])
    e3 = g.tensor("e3", "float32", (1, "T", 8))
    g.node("Reshape", x=e, out=e3, shape=[1, -1, 8])
    y = g.tensor("y", "float32", (1, "T", 8))
    g.node("Add", a=x, b=e3, out=y)
    return y


def _bias_rows(g, x, t_val):  # a [7, 8] bias: each token of a 7-token step its own row
    x2 = g.tensor("x2", "float32", ("T", 8))
    g.node("Reshape", x=x, out=x2, shape=[-1, 8])
    bias = g.const("bias", np.arange(56, dtype=np.float32).reshape(7, 8))
    eye = g.const("eye", np.eye(8, dtype=np.float32))
    y2 = g.tensor("y2", "float32", ("T", 8))
    g.node("Addmm", bias=bias, a=x2, b=eye, out=y2)
    y = g.tensor("y", "float32", (1, "T", 8))
    g.node("Reshape", x=y2, out=y, shape=[1, -1, 8])
    return y


def _matvec(g, x, t_val):  # [1, T, 8] @ [8] -> [1, T]: the token axis stays axis 1
    v = g.const("v", np.linspace(-1, 1, 8, dtype=np.float32))
    s = g.tensor("s", "float32", (1, "T"))
    g.node("Matmul", a=x, b=v, out=s)
    s3 = g.tensor("s3", "float32", (1, "T", 1))
    g.node("Unsqueeze", x=s, out=s3, axis=2)
    w = g.const("w", np.linspace(0, 1, 8, dtype=np.float32).reshape(1, 8))
    y = g.tensor("y", "float32", (1, "T", 8))
    g.node("Matmul", a=s3, b=w, out=y)
    return y


def _outputs(program, toks, force=False):
    """Each row stepped alone (an exception when that fails) and all of them batched."""
    solo = []
    for t in toks:
        try:
            solo.append(np.array(program.session().step(t, range(t.shape[1]))))
        except mlxgraph.GraphRuntimeError as e:
            solo.append(e)
    if force:
        program.__dict__["batching"] = Batching(None, {"logits": 1})
    batched = program.step_batch([(program.session(), t, range(t.shape[1])) for t in toks])
    return solo, [np.array(b) for b in batched]


SEVEN = [mx.array([[1, 2, 3, 4, 5, 6, 7]]), mx.array([[3, 1, 4, 1, 5, 9, 2]])]


@pytest.mark.parametrize("middle, reason, toks", [
    (_squeeze_all, r"node 2 \(Squeeze\) .*token axis", [mx.array([[1]]), mx.array([[2]])]),
    (_literal_seven, r"probe step of 1 token failed", SEVEN),
    (_table_cut, r"node 2 \(Gather\) .*token axis", [mx.array([[1, 2, 3]]), mx.array([[4, 5]])]),
    (_bias_rows, r"probe step of 1 token failed: .*node 2 \(Addmm\)",
     [mx.array([[1, 2, 3]]), mx.array([[4, 5, 6, 7]])]),
])
def test_rows_that_meet_only_beyond_the_probe_are_refused(tmp_path, middle, reason, toks):
    program = mix_graph(tmp_path, middle)
    problem = program.batching.problem
    assert problem is not None and re.search(reason, problem), problem
    with pytest.raises(mlxgraph.SessionError, match="cannot step sessions together"):
        program.step_batch([(program.session(), t, range(t.shape[1])) for t in toks])
    solo, forced = _outputs(program, toks, force=True)
    assert any(isinstance(s, Exception) or s.shape != f.shape or not np.allclose(s, f, atol=1e-4)
               for s, f in zip(solo, forced))


def test_matrix_vector_product_keeps_the_token_axis(tmp_path):
    """[1, T, 8] @ [8] is [1, T]: its tokens stay on axis 1 (not axis 0), so the rows
    are cut where they are."""
    program = mix_graph(tmp_path, _matvec)
    assert program.batching.problem is None
    solo, batched = _outputs(program, [mx.array([[1, 2]]), mx.array([[3]]), mx.array([[4, 5, 6]])])
    for s, b in zip(solo, batched):
        np.testing.assert_allclose(s, b, atol=1e-5)
