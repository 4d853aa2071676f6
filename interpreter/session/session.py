"""Session: per-session state (KV stores keyed by layer_id, value slots) and the step loop.

A step builds one lazy MLX graph: no node forces an evaluation, because everything that
decides a shape (the positions, the cache length) is known on the host. A step that is
rejected, or whose graph fails to build, leaves the session exactly as it was: the KV
stores stage their writes and only commit once every node has run.
"""

from collections.abc import Callable, Sequence
from functools import partial
from numbers import Integral
from typing import TYPE_CHECKING, Any

from mlxgraph.interpreter.cache.kv_cache import CacheError, CachePolicy, make_store
from mlxgraph.interpreter.cache.recurrent_state import RecurrentState
from mlxgraph.interpreter.errors import SessionError
from mlxgraph.interpreter.index_guard import PendingChecks, failed_check_error, poison
from mlxgraph.interpreter.mlx_dtypes import to_mx_dtype
from mlxgraph.interpreter.node_runner import last_position, run_nodes
from mlxgraph.interpreter.session.capacity import AS_ASKED, default_capacity
from mlxgraph.interpreter.session.lock import SessionLock, handle
from mlxgraph.interpreter.session.options import (
    check_preallocation,
    count_option,
    window_per_layer,
)
from mlxgraph.interpreter.session.state import SessionState
from mlxgraph.interpreter.session.step_context import StepContext
from mlxgraph.interpreter.session.step_inputs import (
    bind_inputs,
    checked_tokens,
    host_positions,
    plan_inputs,
)

if TYPE_CHECKING:  # annotations only
    import mlx.core as mx


class Session(SessionState):
    """Runs a Program's main chain step by step with its own KV cache. ``fork()``, ``save``,
    ``restore``, ``describe`` are in session_state.py (copy/deepcopy fork; pickle is refused).

    Args:
        program: the loaded Program.
        capacity: the most tokens of history a full-attention layer holds (default: the
            model's own maximum, bounded by memory: session/capacity.py; the choice and why
            in ``capacity_reason``).
        kv_dtype: storage dtype of the cache ('float16', mx.float16, ...); None = compute dtype.
        windows: ring window per layer: an int for every layer, or {layer_id: window};
            default the graph's own sliding windows. On a sliding layer it only sizes the
            ring (>= the layer's window; 0 = a flat store), never the math; on a
            full-attention layer a window is an approximation (``session.approximations``).
        preallocate: allocate full-attention stores to capacity at once (static) instead of
            growing them by doubling (dynamic).
        max_step: the largest step expected (sizes ring buffers; larger steps still work).
        kv_bits: 0 (floats), 4 or 8: store k/v group-wise affine quantized (mx.quantize).
        kv_group_size: elements per quantization group (32, 64 or 128).
        state_snapshots: a recurrent-state layer keeps its state from before each of the
            last ``state_snapshots`` steps (0: none), the positions ``trim`` may rewind it to
            besides 0 (docs/session-state.md#recurrent-state).
    A session may be used from any thread, one call at a time: a step, trim or reset
    while another thread is inside one raises SessionError (nothing changes). A step
    queues the evaluation of the cache it leaves and keeps handles of its own
    (session/lock.py), so its outputs may be evaluated on its thread while other threads
    use the session.

    Raises:
        SessionError: a bad override (capacity or max_step not an int in [1, 2**31 - 1],
            kv_dtype name, windows naming unknown layers).
        CacheError: a policy a store cannot honour (a non-floating kv_dtype, a negative
            window, a ring window smaller than the layer's own sliding window, kv_bits the
            head dims cannot take), or ``preallocate=True`` asking for more memory than the
            process can allocate.
    """

    def __init__(self, program: Any, capacity: int | None = None, kv_dtype: str | None = None,
                 windows: dict | None = None, preallocate: bool = False,
                 max_step: int | None = None, kv_bits: int = 0, kv_group_size: int = 64,
                 state_snapshots: int = 8):
        self.program = program
        self._pending = PendingChecks()
        # Not self._fail: a bound method in the lock would be a reference cycle, and a
        # finished session's arrays would wait for the cycle collector.
        self._lock = SessionLock(partial(_session_error, program.path))
        self._options = {"capacity": capacity, "kv_dtype": kv_dtype, "windows": windows,
                         "preallocate": preallocate, "max_step": max_step, "kv_bits": kv_bits,
                         "kv_group_size": kv_group_size, "state_snapshots": state_snapshots}
        try:
            self.kv_dtype = to_mx_dtype(kv_dtype) if isinstance(kv_dtype, str) else kv_dtype
        except KeyError:
            raise self._fail(f"kv_dtype {kv_dtype!r} is not a dtype name "
                             "(float32, float16, bfloat16)") from None
        self._windows = window_per_layer(program.layers, windows, self._fail)
        self.capacity_reason = AS_ASKED
        if capacity is None:
            itemsize = getattr(self.kv_dtype, "size", 4)  # the compute dtype's is <= float32's
            capacity, self.capacity_reason = default_capacity(
                program, self._windows, itemsize, int(kv_bits or 0), int(kv_group_size))
            self._options["capacity"] = capacity  # a fork gets the same, whatever memory says
        self.capacity = count_option("capacity", capacity, self._fail)
        default_step = min(self.capacity, 512) if max_step is None else max_step
        self.max_step = count_option("max_step", default_step, self._fail)
        if isinstance(state_snapshots, bool) or not isinstance(state_snapshots, Integral) or (
                not 0 <= state_snapshots <= 4096):
            raise self._fail(f"state_snapshots must be an int in [0, 4096], got "
                             f"{state_snapshots!r}")
        self._preallocate = bool(preallocate)
        self.stores = {}
        self._reset()
        if self._preallocate:
            check_preallocation(self.stores, self.kv_dtype, self.capacity, program.path)
        self._input_plan = plan_inputs(program.graph, program.tensor_dtypes)

    def _fail(self, reason: str) -> SessionError:
        """A SessionError naming the graph file."""
        return _session_error(self.program.path, reason)

    # ------------------------------------------------------------------ state
    @property
    def length(self) -> int:
        """Tokens in the cache: the position the next step must start at."""
        return self._length

    def cache_state(self) -> list:
        """The arrays that hold the KV cache now, e.g. to evaluate after a prefill chunk
        (``mx.eval(*session.cache_state())``) without computing that chunk's logits.

        They are the caller's: handles of the session's own arrays (the same values, no
        copy), so evaluating them never races another thread's call (session/lock.py).

        Raises:
            SessionError: another thread is inside a call on this session.
        """
        with self._exclusive():
            arrays = [handle(a) for a in self._cache_arrays()]
            self._lock.schedule(arrays)
            return arrays

    def _cache_arrays(self) -> list:
        return [a for store in self.stores.values() for a in store.state]

    def _rehandle(self, after_step: bool = False) -> list:
        """Keep handles of every array the session holds instead of the arrays, which the
        step's outputs read (session/lock.py); returns the handles, to be queued before
        the lock is released. ``after_step``: only what the step just read (a recurrent
        store's older snapshots are already the session's alone)."""
        kept = [a for store in self.stores.values() for a in store.rebind(handle, after_step)]
        return kept + self._pending.rebind(handle)

    def reset(self) -> None:
        """Forget all history.

        Raises:
            SessionError: another thread is inside a call on this session.
        """
        with self._lock.hold(self._cache_arrays, settle=False):  # nothing kept to wait for
            self._reset()

    def _reset(self) -> None:
        self._pending.clear()
        self.stores = {}
        bits, group = int(self._options["kv_bits"] or 0), int(self._options["kv_group_size"])
        for lid, lc in self.program.layers.items():
            # The geometry is the model's own record (its window decides the math); the
            # session's window only decides how the store keeps history (make_store checks).
            policy = CachePolicy(self.capacity, self.kv_dtype, self._preallocate,
                                 self._windows[lid], self.max_step, bits, group)
            self.stores[lid] = make_store(lc, policy)
        for lid, info in self.program.states.items():  # recurrent state (format 1.3)
            self.stores[lid] = RecurrentState(info, self.program.state_kinds[lid],
                                              int(self._options["state_snapshots"]))
        self._ctx = StepContext(self.stores)
        self._length = 0

    def trim(self, n: int) -> int:
        """Rewind the last ``n`` tokens; returns the new length.

        Raises:
            SessionError: n is not an int between 0 and the length, or another thread is
                inside a call on this session.
            CacheError: a ring store cannot rewind that far (it says how far); nothing changes.
        """
        with self._exclusive():
            self._raise_failed_checks(keep_latest=False)
            return self._trim(n)

    def _trim(self, n) -> int:
        n = self._check_trim(n)
        for store in self.stores.values() if n else ():
            store.trim(n)
        self._length -= n
        return self._length

    def rewind_target(self, at_most: int) -> int:
        """The longest history of at most ``at_most`` tokens that ``trim`` can take this
        session back to (0 when only a reset would do): any position within every KV
        store's ``max_trim`` that every recurrent state holds a snapshot of (serve's
        prefix cache rewinds a kept session there)."""
        at_most = max(0, min(int(at_most), self._length))
        lowest = 0
        allowed = None  # positions every recurrent state can rewind to (None: any)
        for store in self.stores.values():
            positions = getattr(store, "rewind_positions", None)
            if positions is not None:
                allowed = positions() if allowed is None else allowed & positions()
            else:
                lowest = max(lowest, self._length - store.max_trim)
        if allowed is None:
            return at_most if at_most >= lowest else 0
        return max((p for p in allowed if lowest <= p <= at_most), default=0)

    def _check_trim(self, n) -> int:
        """``n`` as an int, once every store can rewind it (nothing changes here)."""
        if isinstance(n, bool) or not isinstance(n, Integral):
            raise self._fail(f"trim needs an int, got {n!r}")
        n = int(n)
        if n < 0 or n > self._length:
            raise self._fail(f"trim({n}): must be between 0 and the length {self._length}")
        for lid, store in self.stores.items():  # all of them can, before any changes
            refusal = getattr(store, "trim_refusal", None)  # a recurrent state's snapshots
            if refusal is not None:
                if n and (why := refusal(n)):
                    raise CacheError(f"layer {lid}: {why}")
                continue
            limit = getattr(store, "max_trim", None)
            if n and limit is not None and n > limit:
                raise CacheError(f"layer {lid}: cannot rewind {n} tokens, at most {limit}")
        return n

    # ------------------------------------------------------------------ step
    def step(self, tokens: Any, positions: Sequence[int], observer: Callable | None = None,
             last_only: bool = False) -> "mx.array | dict":
        """Run the main chain on one step of tokens.

        Args:
            tokens: [1, T] ints (mx.array, numpy or nested lists).
            positions: [T] host ints (list, range, numpy); must be length .. length+T-1.
            observer: optional ``fn(node_index, node_record, outputs)`` called after each
                node with its outputs (a list); for tools that compare runs.
            last_only: return the output at the last token only (``[1, 1, vocab]``); when
                the output's last node is a Linear (the LM head), it then computes that
                row alone, as a prefill needs it (the cache is filled for every token).
        Returns:
            The graph's output (``logits`` [1, T, vocab]) as a lazy mx.array; a dict when
            the graph has several outputs.
        Raises:
            SessionError / CacheError: the step is rejected; nothing changed.
            GraphRuntimeError: a node failed; nothing changed.
            Any exception (KeyboardInterrupt included) leaves the session as it was.
        """
        with self._exclusive():
            return self._step(tokens, positions, observer, last_only)

    def _exclusive(self):
        """The session's lock for one call (session_lock.py): one call at a time, any thread."""
        return self._lock.hold(self._cache_arrays)

    def check(self) -> None:
        """Read back every pending index check now (evaluating what it needs). Raises
        SessionError (a lazy token id outside the vocabulary) or GraphRuntimeError (a gather's
        computed index out of range), after rewinding to before that step."""
        with self._exclusive():
            self._raise_failed_checks(keep_latest=False)

    def _raise_failed_checks(self, keep_latest: bool) -> None:
        if (failed := self._pending.first_failure(keep_latest)) is None:
            return
        start, n_new, node = failed
        try:
            self._trim(self._length - start)
            rewound = f"the session was rewound to position {start}"
        except CacheError:  # a ring that wrapped past the step
            self._reset()
            rewound = "the session could not rewind that far and was reset"
        raise failed_check_error(self.program, start, n_new, node, rewound, self._fail)

    def _step(self, tokens, positions, observer, last_only=False):
        self._raise_failed_checks(keep_latest=True)
        positions = host_positions(positions, self._length, self._fail)
        n_new = len(positions)
        tokens, token_flag = checked_tokens(tokens, self.program.metadata.vocab_size, self._fail)
        flags = [] if token_flag is None else [(None, token_flag)]
        tensors = list(self.program.initial_tensors)
        values = [None] * self.program.value_count
        shapes = bind_inputs(self._input_plan, {"tokens": tokens, "positions": positions},
                             tensors, values, self._fail)
        # Every shape of a step follows from its symbols' values: the first step with these
        # values checks each output against the verifier's bounds, later ones skip it.
        checked = self.program.checked_shapes
        begun = []
        try:
            # Every store checks the step fits before any of them is written.
            for store in self.stores.values():
                store.begin(n_new)
                begun.append(store)
            cut = self._run(tensors, values, observer, flags, shapes not in checked,
                            n_new if last_only else 0)
            outs = {name: tensors[slot] for name, slot in self.program.outputs.items()}
            if last_only:
                outs = last_position(outs, n_new, self._fail, cut)
        except BaseException:
            # KeyboardInterrupt and SystemExit too: a store left open refuses every later step.
            for store in begun:
                store.rollback()
            raise
        for store in self.stores.values():
            store.commit()
        if len(checked) < 4096:
            checked.add(shapes)
        own = [f for _, f in flags]
        if bad := own + self._pending.unread():
            outs = poison(outs, bad)
        self._pending.add(self._length, n_new, flags)
        self._length += n_new
        # The outputs read the committed buffers and the flags: the session keeps handles.
        self._lock.schedule(self._rehandle(after_step=True))
        return next(iter(outs.values())) if len(outs) == 1 else outs

    def _run(self, tensors, values, observer, flags, check_sizes, last_row=0) -> bool:
        return run_nodes(self.program, tensors, values, self._ctx, observer, flags,
                         check_sizes, last_row)



def _session_error(path, reason: str) -> SessionError:
    return SessionError(f"{path if path else '<bytes>'}: {reason}")


__all__ = ["Session", "StepContext", "SessionError"]
