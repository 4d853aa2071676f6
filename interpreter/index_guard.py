"""Index checks of a step that stay lazy: a gather never reads outside its table.

An index computed in the graph (or token ids handed over as a lazy ``mx.array``) is only
known after evaluation, and evaluating inside a step would stall the pipeline that
overlaps graph building with evaluation. So the step clamps such indices into the table
(the read stays inside it, whatever the index) and keeps a 0-d flag "some index was out
of range". The flags of a step also poison its floating outputs (NaN), which makes them
part of what the caller evaluates; the session reads them back later, when they are
known to be ready (see :class:`PendingChecks`), and then raises.
"""

from collections import deque

import mlx.core as mx

from mlxgraph.interpreter.errors import GraphRuntimeError
from mlxgraph.interpreter.expert_products import GatheredRows
from mlxgraph.schema.spec import FieldKind, op_spec


def clamp_indices(indices: mx.array, size: int, wrap_negative: bool = False, rows=None):
    """``(safe, flag)``: indices clamped into ``[0, size)`` and a lazy 0-d bool, True when
    one was outside (``[-size, size)`` with ``wrap_negative``, which counts from the end).

    With ``rows`` (a batched step: ``((start, count), ...)`` and the indices' token axis
    ``(axis, per)``, or None when they carry no tokens), ``flag`` is a tuple of one flag
    per row, each from its own tokens' indices only (as its solo step would have it).

    Raises:
        ValueError: indices are not integers, or the table is empty (nothing to read).
    """
    if not mx.issubdtype(indices.dtype, mx.integer):
        raise ValueError(f"indices must be integers, got {indices.dtype}")
    if size < 1:
        raise ValueError("the table has no entries to index")
    if indices.dtype.size < 4:
        # int8/uint8/int16 ids cannot hold the clamp bound (mx.clip would refuse it).
        indices = indices.astype(mx.int32)
    if wrap_negative and mx.issubdtype(indices.dtype, mx.signedinteger):
        indices = mx.where(indices < 0, indices + size, indices)
    if mx.issubdtype(indices.dtype, mx.unsignedinteger):
        safe = mx.minimum(indices, size - 1)
    else:
        safe = mx.clip(indices, 0, size - 1)
    bad = safe != indices
    return safe, mx.any(bad) if rows is None else _row_flags(bad, *rows)


def _row_flags(bad, spans, tok) -> tuple:
    if tok is None:  # indices without tokens: the same for every row
        return (mx.any(bad),) * len(spans)
    axis, per = tok
    return tuple(mx.any(bad[(slice(None),) * axis + (slice(start * per, (start + n) * per),)])
                 for start, n in spans)


def poison(outputs: dict, flags: list) -> dict:
    """Floating outputs replaced by NaN where a flag is set (lazily: nothing is evaluated)."""
    bad = flags[0]
    for flag in flags[1:]:  # one node per flag (a stack and a reduction cost more)
        bad = mx.logical_or(bad, flag)
    out = {}
    for name, arr in outputs.items():
        if isinstance(arr, mx.array) and mx.issubdtype(arr.dtype, mx.floating):
            arr = mx.where(bad, mx.array(float("nan"), dtype=arr.dtype), arr)
        out[name] = arr
    return out


class PendingChecks:
    """The index flags of recent steps, read back once they are evaluated.

    A step's flags are read at the second ``step()`` after it (by then a caller that
    pipelines with ``mx.async_eval`` has already waited for it, so reading costs nothing),
    or at ``trim()`` / ``check()`` / ``save()`` / ``describe()``, which read every pending
    flag (evaluating it if needed). Every step is recorded, with or without flags, so
    "the step before" is always the previous step. The step in between, built on a
    history whose last step is not read yet, gets that step's flags too (``unread``):
    its outputs are NaN when its history holds a bad index, never quietly wrong.
    """

    def __init__(self):
        self._steps = deque()  # (start position, tokens, [(what, flag)])

    def add(self, start: int, n_new: int, flags: list) -> None:
        """Record one step and its flags (``flags``: [(what, 0-d bool array)], maybe none)."""
        self._steps.append((start, n_new, flags))

    def unread(self) -> list:
        """The flags not read yet (arrays), which a step built now depends on."""
        return [f for _, _, flags in self._steps for _, f in flags]

    def rebind(self, handle) -> list:
        """Keep ``handle(flag)`` for each flag instead (session/lock.py: a step's outputs are
        poisoned by the flags themselves); returns the new flags."""
        self._steps = deque((start, n, [(what, handle(f)) for what, f in flags])
                            for start, n, flags in self._steps)
        return self.unread()

    def clear(self) -> None:
        """Forget every pending flag (the history they guard is gone)."""
        self._steps.clear()

    def copy(self) -> "PendingChecks":
        """The same pending flags, read independently (a fork shares the history)."""
        twin = PendingChecks()
        twin._steps.extend(self._steps)
        return twin

    def first_failure(self, keep_latest: bool):
        """The oldest failed check as ``(start, n_new, what)``, or None; checked steps are
        dropped. ``keep_latest`` leaves the most recent step unread (it may still be running).
        """
        while len(self._steps) > (1 if keep_latest else 0):
            start, n_new, flags = self._steps.popleft()
            for what, flag in flags:  # (a step without flags is dropped unread)
                if flag.item():
                    self._steps.clear()
                    return start, n_new, what
        return None


def guard_node_indices(node, kw: dict, flags: list, rows=None) -> None:
    """Clamp a gather node's tensor indices into its table (``node.guard`` says which
    argument indexes which table along which axis) and append ``(node, flag)`` to flags
    (in a batched step, ``rows`` as for clamp_indices: a flag per row).

    Raises:
        IndexError: the axis is outside the table's rank. ValueError: see clamp_indices.
    """
    index_field, table_field, axis, wrap = node.guard
    index = kw[index_field]
    if not isinstance(index, mx.array):
        return  # a host int: the kernel checks it
    table = kw[table_field]
    if not -table.ndim <= axis < table.ndim:
        raise IndexError(f"axis {axis} out of range for a tensor of rank {table.ndim}")
    kw[index_field], flag = clamp_indices(index, table.shape[axis], wrap, rows)
    flags.append((node, flag))


def check_output(node, result) -> None:
    """Refuse an output past what the verifier bounded (the file's declared shapes lied).

    Raises:
        ValueError: a tensor with more elements than its slot allows, or a runtime
            integer outside its bound.
    """
    if node.out_kind is FieldKind.VALUE_OUT:
        if isinstance(result, bool) or not isinstance(result, int) or abs(result) > node.limits[0]:
            raise ValueError(
                f"runtime integer {result!r} outside its bound +-{node.limits[0]} "
                "(from the graph's symbol bounds)"
            )
        return
    for arr, limit in zip([result] if node.out_kind is FieldKind.OUT else result, node.limits):
        if isinstance(arr, (mx.array, GatheredRows)) and arr.size > limit:
            raise ValueError(
                f"an output of shape {tuple(arr.shape)} ({arr.size} elements) exceeds the "
                f"{limit} elements its slot's declared shape allows"
            )


def failed_check_error(program, start: int, n_new: int, node, rewound: str, fail) -> Exception:
    """The error of a failed index check: SessionError (``fail``) for a lazy token id
    (``node`` None), else GraphRuntimeError naming the gather node."""
    where = (f"in the step at positions {start}..{start + n_new - 1} (its floating outputs "
             f"are NaN); {rewound}")
    if node is None:
        vocab = program.metadata.vocab_size
        return fail(f"a token id outside the vocabulary [0, {vocab}) {where}")
    return GraphRuntimeError(program.path, node.index, op_spec(node.record.op).short_name,
                             node.record.provenance, f"an index outside its table {where}")
