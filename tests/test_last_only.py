"""Session.step(..., last_only=True): the LM head computes the last token's row alone (a
prefill's logits), the cache still gets every token, and generation prefills in one pass."""

import dataclasses

import mlx.core as mx
import numpy as np
import pytest
from tiny_graph import VOCAB, TinyOracle, build_tiny_graph

import mlxgraph
from mlxgraph.generation.loop import generate
from mlxgraph.generation.sampling import Sampler
from mlxgraph.interpreter.node_runner import last_row_head

TOL = 2e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "tiny.mlxg"
    return path, build_tiny_graph(path)


def _tokens(rng, n):
    return rng.integers(0, VOCAB, n)


def test_head_computes_one_row_and_cache_gets_every_token(tiny):
    path, wts = tiny
    program = mlxgraph.load(path)
    head = program.last_row_head
    assert program.nodes[head].record.op == "LinearNode"
    rng = np.random.default_rng(0)
    session, oracle = program.session(capacity=64), TinyOracle(wts)
    rows = {}

    def watch(index, record, outputs):
        if index == head:
            rows["head"] = outputs[0].shape[-2]

    for n in (7, 1, 4, 1, 1, 9):
        toks = _tokens(rng, n)
        got = session.step(mx.array(toks[None].astype(np.int32)),
                           range(session.length, session.length + n), observer=watch,
                           last_only=True)
        want = oracle.step(toks)[-1:]
        assert got.shape == (1, 1, VOCAB)
        assert rows["head"] == 1
        assert np.abs(np.array(got)[0] - want).max() <= TOL * max(1.0, np.abs(want).max())
    # the cache holds every token: a full step afterwards matches the oracle on every row
    toks = _tokens(rng, 5)
    got = np.array(session.step(mx.array(toks[None].astype(np.int32)),
                                range(session.length, session.length + 5)))[0]
    want = oracle.step(toks)
    assert np.abs(got - want).max() <= TOL * max(1.0, np.abs(want).max())


def test_no_row_wise_head_slices_the_output(tiny):
    path, _ = tiny
    program = mlxgraph.load(path)
    (slot,) = program.outputs.values()
    head = program.nodes[program.last_row_head]
    before = next(n for n in program.nodes if n.index == head.index - 1)
    # an output written by another op, or read by a later node, has no head
    assert last_row_head(program.nodes, {"out": before.out_slots[0]}) is None
    reread = dataclasses.replace(head, index=head.index + 1, tensor_reads=(("x", slot),),
                                 out_slots=(10_000,))
    assert last_row_head([*program.nodes, reread], program.outputs) is None
    # such a program still answers last_only, by slicing the full output
    plain = mlxgraph.load(path)
    plain.last_row_head = None
    toks = mx.array([[1, 2, 3, 4]], dtype=mx.int32)
    full = program.session().step(toks, range(4))
    got = plain.session().step(toks, range(4), last_only=True)
    assert got.shape == (1, 1, VOCAB)
    np.testing.assert_array_equal(np.array(got), np.array(full[:, -1:, :]))


@pytest.mark.parametrize("chunk", [3, 7, 512])
def test_generation_prefills_in_one_pass_with_the_same_tokens(tiny, chunk):
    path, _ = tiny
    program = mlxgraph.load(path)
    prompt = [int(t) for t in _tokens(np.random.default_rng(chunk), 7)]
    one_pass = list(generate(program.session(capacity=64), prompt, Sampler(), 12,
                             prefill_chunk=chunk))
    seen = []
    # on_prefilled must see the cache without the last token: that token is its own step
    last_alone = list(generate(program.session(capacity=64), prompt, Sampler(), 12,
                               prefill_chunk=chunk, on_prefilled=lambda s: seen.append(s.length)))
    assert seen == [len(prompt) - 1]
    assert one_pass == last_alone


def test_an_output_with_tokens_on_another_axis_is_refused(tmp_path):
    """logits [T, 1, V] (tokens first): axis -2 has size 1 but is not the tokens, and the
    head (a Linear on [T, 1, H]) did not cut it, so last_only refuses the step (the
    whole output returned as 'the last row' would be a wrong answer) and the session stays
    as it was."""
    from mlxgraph.interpreter.errors import SessionError
    from mlxgraph.schema.records import Provenance
    from mlxgraph.schema.writer import GraphWriter

    rng = np.random.default_rng(3)
    w = GraphWriter(producer="tests")
    w.add_symbol("T", 1, 16)
    tok, pos = w.add_tensor("tokens", "int32", (1, "T")), w.add_tensor("positions", "int32",
                                                                         ("T",))
    w.add_input("tokens", tok)
    w.add_input("positions", pos)
    embed = w.add_constant("embed", rng.standard_normal((VOCAB, 8)).astype(np.float32))
    head = w.add_constant("head", rng.standard_normal((VOCAB, 8)).astype(np.float32))
    x, xt = w.add_tensor("x", "float32", (1, "T", 8)), w.add_tensor("xt", "float32", ("T", 1, 8))
    w.add_node("Embedding", Provenance("embedding", "embed"), weight=embed, indices=tok, out=x)
    w.add_node("Permute", x=x, out=xt, perm=[1, 0, 2])
    logits = w.add_tensor("logits", "float32", ("T", 1, VOCAB))
    w.add_node("Linear", Provenance("lm_head", "lm_head"), x=xt, weight=head, out=logits)
    w.add_output("logits", logits)
    w.metadata.architecture, w.metadata.num_layers = "TokensFirst", 0
    w.metadata.vocab_size, w.metadata.max_context = VOCAB, 16
    w.write(tmp_path / "first.mlxg")
    program = mlxgraph.load(tmp_path / "first.mlxg")
    assert program.last_row_head is not None   # a Linear head, whose x it cannot cut here
    session = program.session()
    toks = mx.array([[1, 2, 3]], dtype=mx.int32)
    with pytest.raises(SessionError, match="no token axis of 3"):
        session.step(toks, range(3), last_only=True)
    assert session.length == 0
    full = np.array(session.step(toks, range(3)))
    assert full.shape == (3, 1, VOCAB)
    one = session.step(mx.array([[4]], dtype=mx.int32), [3], last_only=True)
    assert one.shape == (1, 1, VOCAB)
