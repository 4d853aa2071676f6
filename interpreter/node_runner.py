"""Run a program's nodes over one step's slots: the loop shared by every kind of step.

A session's step, a batched step over several sessions and the batching probe all bind
their inputs, then call :func:`run_nodes`; what differs between them is the step context
(which KV stores the attention nodes write) and what happens before and after.
"""

import mlx.core as mx

from mlxgraph.interpreter.errors import GraphRuntimeError
from mlxgraph.interpreter.index_guard import check_output, guard_node_indices
from mlxgraph.interpreter.kv_cache import CacheError
from mlxgraph.schema.spec import FieldKind, op_spec

TENSOR, TENSOR_LIST, VALUE = FieldKind.TENSOR, FieldKind.TENSOR_LIST, FieldKind.VALUE
OUT, VALUE_OUT = FieldKind.OUT, FieldKind.VALUE_OUT


def run_nodes(program, tensors, values, ctx, observer=None, flags=None, check_sizes=False):
    """Run every node of ``program`` in order, filling ``tensors`` and ``values`` in place.

    Args:
        program: the Program (its nodes and path).
        tensors, values: the step's slots, inputs and constants already placed.
        ctx: what stateful kernels see (a StepContext).
        observer: optional ``fn(node_index, node_record, outputs)`` after each node.
        flags: a list collecting (node, lazy bool) index-guard flags (None: a throwaway list).
        check_sizes: check each output against the verifier's bounds.
    Raises:
        CacheError: a store refused the write (located: file, node, op).
        GraphRuntimeError: a kernel failed (file, node index, op, provenance).
    """
    flags = [] if flags is None else flags
    for node in program.nodes:
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
        try:
            if node.guard is not None:
                guard_node_indices(node, kw, flags, _guard_rows(program, node, ctx))
            result = node.fn(**kw)
            if check_sizes:
                check_output(node, result)
        except Exception as e:
            raise node_error(program, node, e) from e
        if node.out_kind is VALUE_OUT:
            values[node.out_slots[0]] = result
            outputs = [result]
        else:
            outputs = [result] if node.out_kind is OUT else list(result)
            for i, (slot, dtype) in enumerate(zip(node.out_slots, node.out_dtypes)):
                arr = outputs[i]
                if dtype is not None and isinstance(arr, mx.array) and arr.dtype != dtype:
                    arr = arr.astype(dtype)
                    outputs[i] = arr
                tensors[slot] = arr
        if observer is not None:
            observer(node.index, node.record, outputs)


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
