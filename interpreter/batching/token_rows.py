"""May a program step several sessions at once? The token-row analysis, done once per program.

A batched step packs each session's tokens one after another along the token axis: a
[1, T1 + T2 + ...] step whose positions are each row's own. Every node but attention
then computes each token from that token alone, so every row's result is its solo
result, and UpdateAndAttend splits the rows between their own KV stores. This module
proves the first part for a given graph, node by node, with the rules of token_rules.py:
shapes come from lazy probe steps (MLX computes shapes without evaluating anything), the
token axis is followed from the inputs to the outputs. Two probe sizes (7 tokens, and 1
when the graph allows it) check every output against what its rule said: only its token
axis may change with the token count, so neither a size that equals the probe's count by
coincidence nor a one-token row's size-1 token axis goes unseen. A graph that fails is
refused for batching with the node and the reason; it still runs one session at a time.
"""

from dataclasses import dataclass, field

import mlx.core as mx

from mlxgraph.interpreter.batching.token_rules import Mixing, NodeView, rules
from mlxgraph.interpreter.errors import SessionError
from mlxgraph.interpreter.node_runner import run_nodes
from mlxgraph.interpreter.session.step_context import StepContext
from mlxgraph.interpreter.session.step_inputs import bind_inputs, plan_inputs
from mlxgraph.schema.op_catalogue import Bound, entry
from mlxgraph.schema.spec import FieldKind

VALUE, OPERAND_LIST = FieldKind.VALUE, FieldKind.OPERAND_LIST
PROBE_TOKENS = 7  # any count >= 2 works; an odd prime rarely equals a model dimension


@dataclass(frozen=True)
class Batching:
    """The verdict: ``problem`` is None when sessions may be stepped together, else one line
    naming the node and what it does; ``output_axes`` is each output's token axis;
    ``index_axes`` the token axis (axis, per) of each index-checked node's indices, or
    None (they carry no tokens), so a bad index fails its own row only."""

    problem: str | None
    output_axes: dict = field(default_factory=dict)
    index_axes: dict = field(default_factory=dict)


def analyse(program) -> Batching:
    """Whether ``program``'s sessions may be stepped together (see the module docstring).

    Never raises for a graph that runs: any problem, including a probe step that fails,
    is the verdict's ``problem``.
    """
    where = program.path or "<bytes>"
    if program.stage is not None:
        return Batching(f"{where}: a pipeline stage steps one session at a time")
    graph = program.graph
    tokens, positions = graph.inputs.get("tokens"), graph.inputs.get("positions")
    if tokens is None or positions is None or len(graph.inputs) != 2:
        return Batching(f"{where}: batching needs exactly the inputs tokens and positions, "
                        f"the graph has {sorted(graph.inputs)}")
    t_shape, p_shape = graph.tensors[tokens].shape, graph.tensors[positions].shape
    if (len(t_shape) != 2 or t_shape[0] != 1 or not isinstance(t_shape[1], str)
            or tuple(p_shape) != (t_shape[1],)):
        return Batching(f"{where}: batching needs tokens [1, T] and positions [T] with a "
                        f"symbolic T, the graph has {list(t_shape)} and {list(p_shape)}")
    symbol = next(s for s in graph.symbols if s.name == t_shape[1])
    count = PROBE_TOKENS if symbol.max is None else min(symbol.max, PROBE_TOKENS)
    if count < 2 or count < symbol.min:
        return Batching(f"{where}: steps of this graph cannot hold two tokens "
                        f"({symbol.name} in [{symbol.min}, {symbol.max}])")
    # The rules read the larger probe's shapes; the smaller (one token, a decode row's
    # shape, when the graph allows it) shows which sizes really grow with the token count.
    small = max(1, symbol.min)
    probes = {}
    for n in dict.fromkeys((count, small)):
        try:
            probes[n] = _probe(program, n)
        except Exception as e:  # noqa: BLE001 - the verdict says why, the caller decides
            return Batching(f"{where}: a probe step of {n} token{'s' * (n > 1)} failed: {e}")
    shapes, numbers = probes[count]
    # Token axes as (axis, entries per token); sizes as (c, d) = c * tokens + d.
    axes = {tokens: (1, 1), positions: (0, 1)}
    token_values = {} if symbol.value is None else {symbol.value: (1, 0)}
    for node in program.nodes:
        op = entry(node.record.op)
        try:
            _check_reads(node, op, token_values)
            rule = rules().get(op.name)
            if rule is None:
                raise Mixing(f"op {op.name} has no batching rule in this mlxgraph")
            out = rule(NodeView(node, shapes, numbers, axes, token_values))
        except Mixing as e:
            return Batching(f"{where}: node {node.index} ({op.name}) {e}; its sessions step one "
                            "at a time")
        for slot, a in zip(node.out_slots, out):
            target = token_values if node.out_kind is FieldKind.VALUE_OUT else axes
            if a is not None:
                target[slot] = a
        if (reason := _unexplained(node, probes, axes, token_values)) is not None:
            return Batching(f"{where}: node {node.index} ({op.name}) {reason}; its sessions step "
                            "one at a time")
    missing = [name for name, slot in graph.outputs.items() if axes.get(slot, (0, 0))[1] != 1]
    if missing:
        return Batching(f"{where}: output {missing[0]} does not carry one entry per token, so "
                        "it cannot be split by row")
    index_axes = {node.index: axes.get(dict(node.tensor_reads).get(node.guard[0]))
                  for node in program.nodes if node.guard is not None}
    return Batching(None, {name: axes[slot][0] for name, slot in graph.outputs.items()},
                    index_axes)


def _check_reads(node, op, token_values) -> None:
    """Refuse a node that computes with the token count (or a number derived from it), except
    for sizing an axis (Reshape, Expand, Full) and the arithmetic that only passes it on."""
    if op.bound is Bound.ARITH:
        return
    for name, how, where in node.reads:
        if how is VALUE:
            used = [token_values.get(where)]
        elif how is OPERAND_LIST:
            used = [token_values.get(w) for h, w in where if h is VALUE]
        else:
            continue
        for kind in used:
            if kind is None or (kind != "derived" and kind[1] == 0 and op.sizes_from_operands
                                and name == "shape"):
                continue
            what = "the token count" if kind == (1, 0) else "a number computed from the token count"
            raise Mixing(f"reads {what} in {name}, which packing would change")


def _unexplained(node, probes, axes, token_values) -> str | None:
    """Why ``node``'s outputs in the probe steps do not follow from the token axes the rules
    gave them, or None (see :func:`_follows`)."""
    value_out = node.out_kind is FieldKind.VALUE_OUT
    for i, slot in enumerate(node.out_slots):
        seen = {n: probe[1 if value_out else 0][slot] for n, probe in probes.items()}
        tok = (token_values if value_out else axes).get(slot)
        if tok == "derived" or any(s is None for s in seen.values()):
            continue
        if not _follows(seen, tok, value_out):
            return (f"gives output {i} {seen} for steps of {list(seen)} tokens, which its token "
                    f"axis ({'none' if tok is None else tok[0]}) does not explain")
    return None


def _follows(seen, tok, value_out) -> bool:
    """Whether ``seen`` ({tokens: shape or number}) is what ``tok`` says: a number is c x
    tokens (tok (c, 0)) or the same in every step; a shape's token axis holds per x tokens
    entries (tok (axis, per)) and every other axis is the same size in every step."""
    if value_out:
        return (all(v == tok[0] * n for n, v in seen.items()) if tok is not None
                else len(set(seen.values())) == 1)
    if len({len(s) for s in seen.values()}) != 1:
        return False
    rank = len(next(iter(seen.values())))
    axis, per = (None, 0) if tok is None else tok
    if axis is not None and not 0 <= axis < rank:
        return False
    for a in range(rank):
        sizes = {n: s[a] for n, s in seen.items()}
        if a == axis and any(d != per * n for n, d in sizes.items()):
            return False
        if a != axis and len(set(sizes.values())) != 1:
            return False
    return True


def _probe(program, count) -> tuple:
    """Every tensor slot's shape in a lazy step of ``count`` tokens (nothing is evaluated)."""
    from mlxgraph.interpreter.session.session import Session

    session = Session(program, max_step=count)
    tensors = list(program.initial_tensors)
    values = [None] * program.value_count
    inputs = {"tokens": mx.zeros((1, count), dtype=mx.int32), "positions": list(range(count))}
    bind_inputs(plan_inputs(program.graph, program.tensor_dtypes), inputs, tensors, values,
                SessionError)
    stores = list(session.stores.values())
    for store in stores:
        store.begin(count)
    try:
        run_nodes(program, tensors, values, StepContext(session.stores))
    finally:
        for store in stores:
            store.rollback()
    return [None if t is None else tuple(t.shape) for t in tensors], values
