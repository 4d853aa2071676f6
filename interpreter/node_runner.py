"""Run a program's nodes over one step's slots: the loop shared by every kind of step.

A session's step, a batched step over several sessions and the batching probe all bind
their inputs, then call :func:`run_nodes`; what differs between them is the step context
(which KV stores the attention nodes write) and what happens before and after.
"""

import mlx.core as mx

from mlxgraph.interpreter.cache.kv_cache import CacheError
from mlxgraph.interpreter.errors import GraphRuntimeError
from mlxgraph.interpreter.expert_products import materialized
from mlxgraph.interpreter.index_guard import check_output, guard_node_indices
from mlxgraph.interpreter.straight_line import compile_nodes
from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.schema.spec import FieldKind, op_spec

TENSOR, TENSOR_LIST, VALUE = FieldKind.TENSOR, FieldKind.TENSOR_LIST, FieldKind.VALUE
OUT, VALUE_OUT = FieldKind.OUT, FieldKind.VALUE_OUT


def last_row_head(nodes, outputs) -> int | None:
    """The index of the node that computes the graph's only output row by row from its
    input ``x`` (a Linear: the LM head), when nothing else reads that output; else None.

    A step that wants only the last token's output (``Session.step(..., last_only=True)``)
    then feeds this node the last row of ``x`` alone: a prefill's LM head costs one row
    instead of T.
    """
    if len(outputs) != 1:
        return None
    (slot,) = outputs.values()
    head = None
    for node in nodes:
        if slot in _slots_read(node):
            return None
        if slot in node.out_slots:
            ok = node.out_kind is OUT and entry(node.record.op).has(Trait.ROW_WISE)
            head = node.index if ok else None
    return head


def _slots_read(node) -> set:
    slots = {where for _, where in node.tensor_reads}
    for _, how, where in node.reads:
        if how is TENSOR_LIST:
            slots.update(where)
        elif how is not VALUE:
            slots.update(w for h, w in where if h is TENSOR)
    return slots


def last_position(outs, n_new: int, fail, cut: bool = False):
    """The outputs (an array or a dict of them) at the step's last token: axis -2 is the
    token axis. ``cut``: the output's head computed the last row alone (:func:`run_nodes`
    returned True), so the output is that row already.

    Raises:
        ``fail(message)``: an output whose second-to-last axis is not the step's tokens
        (an axis of 1 for a step of several tokens, unless the head cut it, is not).
    """
    if isinstance(outs, dict):
        return {name: last_position(a, n_new, fail, cut) for name, a in outs.items()}
    if outs.ndim < 2 or outs.shape[-2] != (1 if cut else n_new):
        raise fail(f"last_only: the output of shape {tuple(outs.shape)} has no token axis "
                   f"of {n_new} second to last")
    return outs if outs.shape[-2] == 1 else outs[..., -1:, :]


def run_nodes(program, tensors, values, ctx, observer=None, flags=None, check_sizes=False,
              last_row=0):
    """Run every node of ``program`` in order, filling ``tensors`` and ``values`` in place.

    Args:
        program: the Program (its nodes, path and last_row_head).
        tensors, values: the step's slots, inputs and constants already placed.
        ctx: what stateful kernels see (a StepContext).
        observer: optional ``fn(node_index, node_record, outputs)`` after each node.
        flags: a list collecting (node, lazy bool) index-guard flags (None: a throwaway list).
        check_sizes: check each output against the verifier's bounds.
        last_row: 0, or the step's token count T when only the last token's output is
            wanted: the output's head (:func:`last_row_head`) then computes that row alone.
    Returns:
        True when the head computed the last row alone (its input's axis -2 was the T
        tokens), else False.
    Raises:
        CacheError: a store refused the write (located: file, node, op).
        GraphRuntimeError: a kernel failed (file, node index, op, provenance).
    """
    flags = [] if flags is None else flags
    head = program.last_row_head if last_row > 1 else None
    if observer is None and not check_sizes and head is None:
        # The common step (every decode step): the nodes compiled once into straight-line
        # code (straight_line.py), the same kernels in the same order as the loop below.
        program.straight_line(tensors, values, ctx, flags)
        return False
    cut = False
    for node in program.nodes:
        try:
            outputs, cut_here = _run_node(program, node, tensors, values, ctx, flags,
                                          check_sizes, head, last_row)
        except Exception as e:
            raise node_error(program, node, e) from e
        cut = cut or cut_here
        if observer is not None:  # an expert product's rows are computed for it to see
            observer(node.index, node.record, [materialized(o) for o in outputs])
    return cut


def compile_program_nodes(program):
    """``program``'s nodes as one straight-line function (straight_line.py), whose guarded
    nodes run through this module's per-node code."""
    def run_one(node, tensors, values, ctx, flags):
        _run_node(program, node, tensors, values, ctx, flags)

    return compile_nodes(program.nodes, run_one, lambda node, e: node_error(program, node, e))


def _run_node(program, node, tensors, values, ctx, flags, check_sizes=False, head=None,
              last_row=0):
    """Run one node, writing its outputs into the slots; (its outputs as a list, whether it
    computed the last row alone). Exceptions are the kernel's own (the caller locates them)."""
    kw = node.fixed.copy()
    for name, slot in node.tensor_reads:
        kw[name] = tensors[slot]
    for name, how, where in node.reads:
        if how is VALUE:
            kw[name] = values[where]
        elif how is TENSOR_LIST:
            kw[name] = [tensors[i] for i in where]
        else:  # OPERAND_LIST: tensors, runtime ints and literals mixed
            kw[name] = [tensors[w] if h is TENSOR else values[w] if h is VALUE else w
                        for h, w in where]
    if node.needs_context:
        kw["ctx"] = ctx
    cut = False
    if node.index == head and kw["x"].ndim >= 2 and kw["x"].shape[-2] == last_row:
        kw["x"], cut = kw["x"][..., -1:, :], True
    if node.guard is not None:
        guard_node_indices(node, kw, flags, _guard_rows(program, node, ctx))
    result = node.fn(**kw)
    if check_sizes:
        check_output(node, result)
    if node.out_kind is VALUE_OUT:
        values[node.out_slots[0]] = result
        return [result], cut
    outputs = [result] if node.out_kind is OUT else list(result)
    for i, (slot, dtype) in enumerate(zip(node.out_slots, node.out_dtypes)):
        arr = outputs[i]
        if dtype is not None and isinstance(arr, mx.array) and arr.dtype != dtype:
            arr = arr.astype(dtype)
            outputs[i] = arr
        tensors[slot] = arr
    return outputs, cut


def _guard_rows(program, node, ctx):
    """A batched step's row spans and the token axis of ``node``'s indices (its index
    checks are then per row); None for one session's step."""
    if ctx.rows is None:
        return None
    return (tuple((start, n) for _, start, n in ctx.rows),
            program.batching.index_axes.get(node.index))


def node_error(program, node, e: Exception) -> Exception:
    """A kernel's exception, located: the file, node index, op and source."""
    rec, op = node.record, op_spec(node.record.op).short_name
    if isinstance(e, CacheError):
        # Still a CacheError (the step is rejected, nothing changed), now located.
        return CacheError(f"{program.path or '<bytes>'}: node {node.index} ({op}): {e}")
    return GraphRuntimeError(program.path, node.index, op, rec.provenance,
                             f"{type(e).__name__}: {e}")
