"""The straight-line step (interpreter/straight_line.py) is the node loop, compiled: every
decode step after a shape's first runs it, and its outputs equal the loop's bit for bit
over many steps; a failing kernel is located exactly as the loop locates it."""

import mlx.core as mx
import numpy as np
import pytest
from tiny_graph import VOCAB, TinyOracle, build_tiny_graph

import mlxgraph
from mlxgraph.interpreter.node_plan import ResolvedNode
from mlxgraph.interpreter.straight_line import compile_nodes
from mlxgraph.schema.spec import FieldKind


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "tiny.mlxg"
    return path, build_tiny_graph(path, windows=(0, 4))


def test_straight_line_equals_the_loop_bitwise_over_many_steps(tiny):
    path, wts = tiny
    program = mlxgraph.load(path)
    calls = []
    compiled = program.straight_line
    program.straight_line = lambda *a: calls.append(1) or compiled(*a)
    fast, loop = program.session(capacity=64), program.session(capacity=64)
    oracle, rng = TinyOracle(wts, windows=(0, 4)), np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.choice([1, 1, 1, 2, 3]))
        toks = mx.array(rng.integers(0, VOCAB, (1, n)).astype(np.int32))
        pos = range(fast.length, fast.length + n)
        got = fast.step(toks, pos)
        want = loop.step(toks, pos, observer=lambda *_: None)  # an observer: the loop
        assert np.array_equal(np.array(got), np.array(want))
        ref = oracle.step(np.array(toks)[0])
        assert np.abs(np.array(got).reshape(ref.shape) - ref).max() < 2e-4 * max(
            1.0, np.abs(ref).max())
    assert len(calls) > 20  # all but the first step of each shape


def _node(index, fn, reads, out):
    return ResolvedNode(index=index, record=None, fn=fn, needs_context=False,
                        tensor_reads=reads, reads=(), fixed={}, out_kind=FieldKind.OUT,
                        out_slots=(out,), out_dtypes=(mx.float32,))


def test_a_failing_kernel_is_located_by_its_node():
    def boom(x):
        raise ValueError("no")

    nodes = [_node(0, lambda x: x + 1, (("x", 0),), 1), _node(5, boom, (("x", 1),), 2)]
    located = []

    def fail(node, e):
        located.append((node.index, e))
        return RuntimeError(f"node {node.index}: {e}")

    run = compile_nodes(nodes, run_one=None, fail=fail)
    tensors = [mx.array([1.0]), None, None]
    with pytest.raises(RuntimeError, match="node 5: no") as info:
        run(tensors, [], None, [])
    assert isinstance(info.value.__cause__, ValueError)
    assert located[0][0] == 5 and float(tensors[1][0]) == 2.0


def test_outputs_take_their_declared_dtype():
    nodes = [_node(0, lambda x: x.astype(mx.float16), (("x", 0),), 1)]
    tensors = [mx.array([1.5]), None]
    compile_nodes(nodes, None, None)(tensors, [], None, [])
    assert tensors[1].dtype == mx.float32
