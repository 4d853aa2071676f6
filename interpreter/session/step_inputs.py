"""A step's inputs, checked and bound before anything runs: tokens, positions, graph inputs.

Each function takes ``fail(reason) -> SessionError`` (the session's, naming the file), so
every rejection reads the same and leaves the session untouched.
"""

import mlx.core as mx
import numpy as np

from mlxgraph.interpreter.index_guard import clamp_indices
from mlxgraph.schema.errors import GraphFormatError


def plan_inputs(graph, tensor_dtypes) -> list:
    """(name, slot, mx dtype or None, [(axis, int size or Symbol)]) for each graph input;
    ``tensor_dtypes``: the program's dtype per tensor slot (after any widening).

    Raises:
        GraphFormatError: an input dim is dynamic without a symbol (it could not be bound).
    """
    plan = []
    for name, slot in graph.inputs.items():
        t = graph.tensors[slot]
        dims = []
        for axis, d in enumerate(t.shape):
            if d is None:
                raise GraphFormatError(f"graph input {name!r}: axis {axis} is dynamic without a "
                                       "symbol", graph.path, None, "inputs")
            if isinstance(d, str):
                sym = next(s for s in graph.symbols if s.name == d)
                dims.append((axis, sym))
            else:
                dims.append((axis, d))
        plan.append((name, slot, tensor_dtypes[slot], dims))
    return plan


def checked_tokens(tokens, vocab: int, fail) -> tuple:
    """``(tokens, flag)``: token ids checked to be integers and inside the vocabulary.

    An out-of-range id would index past the embedding table. Host ids are checked now
    (flag None). Token arrays already in MLX, such as a sampler's lazy output, are not read
    back (that would force an evaluation): they are clamped into [0, vocab) and ``flag`` is
    a lazy 0-d bool, True when one was outside (interpreter/index_guard.py).

    Raises:
        SessionError: not integers, or a host id outside [0, vocab).
    """
    if isinstance(tokens, mx.array):
        if not mx.issubdtype(tokens.dtype, mx.integer):
            raise fail(f"tokens must be integers, got {tokens.dtype}")
        return clamp_indices(tokens, vocab) if vocab > 0 else (tokens, None)
    arr = np.asarray(tokens)
    if arr.dtype.kind not in "iu":
        raise fail(f"tokens must be integers, got {arr.dtype}")
    if arr.size and (arr.min() < 0 or (vocab and arr.max() >= vocab)):
        bad = arr[(arr < 0) | (arr >= vocab)] if vocab else arr[arr < 0]
        raise fail(f"token id {int(bad.reshape(-1)[0])} is outside the vocabulary [0, {vocab})")
    return arr, None


def host_positions(positions, length: int, fail) -> list:
    """The step's positions as host ints; they must be ``length .. length + T - 1``.

    Raises:
        SessionError: not integers, empty, or not where the cache ends.
    """
    if isinstance(positions, range) or (type(positions) is list
                                        and all(type(p) is int for p in positions)):
        pos = list(positions)  # what generation loops pass: no numpy round trip
    else:
        if isinstance(positions, mx.array):
            positions = np.array(positions)
        arr = np.asarray(positions)
        if arr.size and arr.dtype.kind not in "iu":
            # 3.9 is not position 3: a float (or bool) position is a caller's bug.
            raise fail(f"positions must be integers, got {arr.dtype}")
        pos = [int(p) for p in arr.reshape(-1)]
    if not pos:
        raise fail("a step needs at least one token")
    if pos != list(range(length, length + len(pos))):
        raise fail(f"positions {pos[0]}..{pos[-1]} disagree with the cache: the next step must "
                   f"start at position {length} and be consecutive")
    return pos


def bind_inputs(plan, given: dict, tensors: list, values: list, fail) -> tuple:
    """Place each graph input in its tensor slot and each symbolic size in its value slot.

    Returns:
        The symbols' values, sorted by name: every shape of the step follows from them.
    Raises:
        SessionError: a missing input, a wrong rank or size, a size outside the graph's
            bounds, or two inputs disagreeing on one symbol.
    """
    bound = {}
    for name, slot, dtype, dims in plan:
        if name not in given:
            raise fail(f"the graph needs input {name!r}; step() gives tokens and positions")
        arr = _as_array(given[name], dtype)
        if arr.ndim != len(dims):
            raise fail(f"input {name}: expected {len(dims)} dims, got shape {tuple(arr.shape)}")
        for axis, d in dims:
            size = arr.shape[axis]
            if isinstance(d, int):
                if size != d:
                    raise fail(f"input {name}: axis {axis} must be {d}, got {size}")
                continue
            if size < d.min or (d.max is not None and size > d.max):
                raise fail(f"input {name}: {d.name}={size} outside the graph's bounds "
                           f"[{d.min}, {d.max}]")
            if bound.setdefault(d.name, size) != size:
                raise fail(f"input {name}: {d.name}={size} disagrees with {bound[d.name]} "
                           "from another input")
            if d.value is not None:
                values[d.value] = size
        tensors[slot] = arr
    return tuple(sorted(bound.items()))


_INT32 = (-2**31, 2**31 - 1)


def _as_array(value, dtype):
    """``value`` as an MLX array of ``dtype`` (None: its own). Host ints that int32 holds
    (a step's positions, as host_positions leaves them) go straight in: numpy's int64 copy
    and a cast node per step cost more than the rest of the binding."""
    if (type(value) is list and value and dtype is mx.int32
            and all(type(v) is int for v in value)
            and _INT32[0] <= min(value) and max(value) <= _INT32[1]):
        return mx.array(value, dtype=mx.int32)
    arr = value if isinstance(value, mx.array) else mx.array(np.asarray(value))
    return arr if dtype is None or arr.dtype == dtype else arr.astype(dtype)
