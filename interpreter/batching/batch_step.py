"""One step for several sessions of a program: their tokens packed into one evaluation.

The rows' tokens go one after another on the token axis (a [1, T1 + T2 + ...] step, each
row with its own positions), so the weights are read once for all of them; attention
writes and reads each row's own KV stores (kernels/attention.py). token_rows.py proves,
once per program, that nothing else lets one row see another. Every session ends exactly
as if it had been stepped alone; a rejection or failure of any row leaves them all as
they were.
"""

from contextlib import ExitStack

import mlx.core as mx
import numpy as np

from mlxgraph.interpreter.index_guard import poison
from mlxgraph.interpreter.node_runner import run_nodes
from mlxgraph.interpreter.session.step_context import StepContext
from mlxgraph.interpreter.session.step_inputs import bind_inputs, checked_tokens, host_positions


def step_batch(program, rows, observer=None) -> list:
    """Step several sessions of ``program`` in one evaluation (see Program.step_batch)."""
    from mlxgraph.interpreter.errors import SessionError
    from mlxgraph.interpreter.session.session import Session

    where = program.path or "<bytes>"
    rows = list(rows)
    if not rows:
        raise SessionError(f"{where}: step_batch needs at least one (session, tokens, "
                           "positions) row")
    seen = set()
    for i, row in enumerate(rows):
        if not isinstance(row, tuple | list) or len(row) != 3:
            raise SessionError(f"{where}: step_batch row {i} must be (session, tokens, "
                               f"positions), got {type(row).__name__}")
        s = row[0]
        if not isinstance(s, Session) or s.program is not program:
            raise SessionError(f"{where}: step_batch row {i}: not a session of this program")
        if id(s) in seen:
            raise SessionError(f"{where}: step_batch row {i}: the same session twice (a "
                               "session takes one step at a time)")
        seen.add(id(s))
    if len(rows) == 1:
        s, tokens, positions = rows[0]
        return [s.step(tokens, positions, observer)]
    if program.batching.problem:
        raise SessionError(f"cannot step sessions together: {program.batching.problem}")
    with ExitStack() as held:
        for s, _, _ in rows:
            held.enter_context(s._exclusive())
        return _step_locked(program, rows, observer)


def _row_inputs(program, s, tokens, positions) -> tuple:
    """(tokens [1, n] as mx.array, host positions, token flag or None) of one row."""
    s._raise_failed_checks(keep_latest=True)
    pos = host_positions(positions, s.length, s._fail)
    tokens, flag = checked_tokens(tokens, program.metadata.vocab_size, s._fail)
    arr = tokens if isinstance(tokens, mx.array) else mx.array(np.asarray(tokens))
    if tuple(arr.shape) != (1, len(pos)):
        raise s._fail(f"tokens must have shape [1, {len(pos)}] (one per position), got "
                      f"{tuple(arr.shape)}")
    return arr, pos, flag


def _step_locked(program, rows, observer) -> list:
    packed = [_row_inputs(program, s, t, p) for s, t, p in rows]
    # Every row in the graph's token dtype (a solo step casts to it too): packed in the
    # first row's dtype, a uint8 row first would wrap another row's id 300 to 44.
    dtype = program.tensor_dtypes[program.graph.inputs["tokens"]] or mx.int32
    tokens = mx.concatenate([a if a.dtype == dtype else a.astype(dtype) for a, _, _ in packed],
                            axis=1)
    positions = [p for _, pos, _ in packed for p in pos]
    first = rows[0][0]
    most = _most_tokens(program)
    if most is not None and len(positions) > most:
        raise first._fail(f"a batched step of {len(positions)} tokens ({len(rows)} rows) is more "
                          f"than the graph's largest step ({most} tokens); step fewer rows or "
                          "shorter chunks")
    tensors = list(program.initial_tensors)
    values = [None] * program.value_count
    shapes = bind_inputs(first._input_plan, {"tokens": tokens, "positions": positions},
                         tensors, values, first._fail)
    spans, start = [], 0
    for (s, _, _), (_, pos, _) in zip(rows, packed):
        spans.append((s.stores, start, len(pos)))
        start += len(pos)
    flags, begun = [], []
    try:
        for stores, _, n in spans:
            for store in stores.values():
                store.begin(n)
                begun.append(store)
        run_nodes(program, tensors, values, StepContext({}, tuple(spans)), observer, flags,
                  shapes not in program.checked_shapes)
    except BaseException:
        for store in begun:
            store.rollback()
        raise
    for store in begun:
        store.commit()
    if len(program.checked_shapes) < 4096:
        program.checked_shapes.add(shapes)
    outputs = {name: tensors[slot] for name, slot in program.outputs.items()}
    results = [_row_result(program, outputs, s, sp, flag, [(node, f[i]) for node, f in flags])
               for i, ((s, _, _), sp, (_, _, flag)) in enumerate(zip(rows, spans, packed))]
    # What the sessions keep (handles of what the outputs read) is queued now, inside their
    # locks (session/lock.py), and so is every row's output: the rows are cuts of one packed
    # graph, and two threads evaluating two rows would otherwise both wait on its arrays
    # (SIGSEGV inside MLX); queued, each row is an array of its own to wait on.
    outs = [a for r in results for a in (r.values() if isinstance(r, dict) else (r,))]
    first._lock.schedule([a for s, _, _ in rows for a in s._rehandle(after_step=True)] + outs)
    return results


def _most_tokens(program):
    """The largest step the graph takes (its token symbol's upper bound), or None."""
    graph = program.graph
    name = graph.tensors[graph.inputs["tokens"]].shape[1]
    return next((s.max for s in graph.symbols if s.name == name), None)


def _row_result(program, outputs, session, span, token_flag, node_flags):
    """One row's outputs, cut from the packed ones; its session moves on by its tokens.
    ``node_flags``: this row's own index checks."""
    _, start, n = span
    axes = program.batching.output_axes
    outs = {name: out[(slice(None),) * axes[name] + (slice(start, start + n),)]
            for name, out in outputs.items()}
    row_flags = ([] if token_flag is None else [(None, token_flag)]) + node_flags
    own = [f for _, f in row_flags]
    if bad := own + session._pending.unread():
        outs = poison(outs, bad)
    session._pending.add(session.length, n, row_flags)
    session._length += n
    return next(iter(outs.values())) if len(outs) == 1 else outs
