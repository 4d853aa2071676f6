"""Off-graph recurrent state of one layer (docs/architecture.md#recurrent-state): a
CausalConv layer's last inputs (kind ``conv_state``), an SsdScan layer's S (``ssm_state``).

The store follows the KV stores' step protocol, so a session begins, commits and rolls
back every store alike: ``begin(T)``, then the kernel's ``read(dtype)`` (the committed
state, zeros in a new session) and ``write(new)`` (stages the next one), then
``commit()`` or ``rollback()``. Nothing here evaluates.

Unlike a KV cache, a recurrent state cannot be rewound by slicing. The store keeps the
state from before each of its last ``keep`` steps (a snapshot per step start: every
prefill chunk's end, every decode step; MLX arrays are values, so a snapshot is a
reference, and costs memory only once the state moves on) and the zero state of position
0, and rewinds to those positions only; a trim to any other position is refused in one
line (``trim_refusal``) before anything changes.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlxgraph.interpreter.cache.types import CacheError
from mlxgraph.interpreter.session.fork_protocol import ForksOnCopy
from mlxgraph.schema.records import StateLayerInfo

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
_NUMPY = {mx.float32: np.dtype("<f4"), mx.float16: np.dtype("<f2"), mx.bfloat16: np.dtype("<u2")}


class RecurrentState(ForksOnCopy):
    """The recurrent state of one layer (see the module docstring).

    Attributes:
        info: the layer's metadata entry (shape, batch first, and storage dtype).
        kind: what state it is (the op catalogue's ``state`` fact of the node keeping it).
        length: tokens seen so far.
    """

    _PICKLE_ADVICE = "use fork() for a copy"

    def __init__(self, info: StateLayerInfo, kind: str, keep: int = 8):
        self.info, self.kind = info, kind
        self.keep = keep  # snapshots kept: the states before the last `keep` steps
        self.reset()

    def reset(self) -> None:
        """Forget all history (and any open step): the state is zeros again."""
        self.length = 0
        self._state: mx.array | None = None  # None: zeros, made at the first update
        self._pending: int | None = None
        self._staged: mx.array | None = None
        self._snapshots: list = []  # [(position, state before the step there)], oldest first

    def begin(self, n_new: int) -> None:
        """Open a step of ``n_new`` tokens.

        Raises:
            CacheError: a step is already open or ``n_new`` is not a positive int.
        """
        if self._pending is not None:
            raise self._error("a step is already open; commit() or rollback() it first")
        if not isinstance(n_new, int) or isinstance(n_new, bool) or n_new < 1:
            raise self._error(f"step size must be a positive int, got {n_new!r}")
        self._pending = n_new

    def read(self, dtype) -> mx.array:
        """The committed state (zeros of the layer's shape before the first step) in ``dtype``."""
        if self._state is None:
            return mx.zeros(self.info.shape, dtype=dtype)
        return self._state.astype(dtype)

    def write(self, state: mx.array) -> None:
        """Stage the state this step leaves (a step must be open).

        Raises:
            CacheError: no step is open, a write is already staged, or its shape is not
                the layer's. The store is unchanged.
        """
        if self._pending is None or self._staged is not None:
            raise self._error("write() needs an open step without a staged write")
        if tuple(state.shape) != self.info.shape:
            raise self._error(f"a state of shape {state.shape}, expected {list(self.info.shape)}")
        self._staged = state

    def commit(self) -> None:
        """Make the staged state the store's state (``length += T``).

        Raises:
            CacheError: nothing was staged (no ``update`` since ``begin``).
        """
        if self._staged is None:
            raise self._error("commit() without a staged update()")
        if self.keep:
            self._snapshots = [*self._snapshots, (self.length, self._state)][-self.keep:]
        self._state, self.length = self._staged, self.length + self._pending
        self._pending = self._staged = None

    def rollback(self) -> None:
        """Drop the open step (if any); the store is exactly as before ``begin``."""
        self._pending = self._staged = None

    def trim_refusal(self, n: int) -> str | None:
        """Why ``trim(n)`` is refused (None: it is not): position ``length - n`` must be 0
        or the start of a kept step."""
        target = self.length - n
        if n == 0 or target == 0 or any(p == target for p, _ in self._snapshots):
            return None
        held = ", ".join(str(p) for p in [0, *(p for p, _ in self._snapshots if p)])
        return (f"cannot rewind {n} tokens to position {target}: a recurrent state is kept "
                f"only at positions {held} (the starts of its last {self.keep} steps)")

    def trim(self, n: int) -> int:
        """Rewind ``n`` tokens, to position 0 or the start of a kept step.

        Raises:
            CacheError: a step is open, n is not an int in [0, length], or no snapshot
                holds the state at ``length - n`` (``trim_refusal``). Nothing changes then.
        """
        if self._pending is not None:
            raise self._error("cannot trim while a step is open")
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self.length:
            raise self._error(f"trim needs an int in [0, {self.length}], got {n!r}")
        if why := self.trim_refusal(n):
            raise self._error(why)
        target = self.length - n
        if n:
            self._state = None if target == 0 else dict(self._snapshots)[target]
            self._snapshots = [(p, s) for p, s in self._snapshots if p < target]
        self.length = target
        return target

    def rewind_positions(self) -> set:
        """Every position ``trim`` can take this store back to: 0, the starts of its kept
        steps, and its length."""
        return {0, self.length, *(p for p, _ in self._snapshots)}

    @property
    def max_trim(self) -> int:
        """Largest ``m`` such that ``trim(n)`` accepts every n in [0, m]: the run of kept
        one-token steps back from the end (all of the history when it reaches position 0)."""
        starts = {p for p, _ in self._snapshots} | {0}
        m = 0
        while m < self.length and self.length - m - 1 in starts:
            m += 1
        return m

    @property
    def state(self) -> tuple:
        """The committed state, e.g. for ``mx.async_eval``."""
        return () if self._state is None else (self._state,)

    @property
    def nbytes(self) -> int:
        """Bytes the state holds (0 before the first step)."""
        return 0 if self._state is None else self._state.nbytes

    def preallocation_elements(self) -> int:
        """KV elements a preallocated store holds: none (a state is not KV)."""
        return 0

    def fork(self):
        """An independent store with the same state (the array shared: MLX arrays are values).

        Raises:
            CacheError: a step is open.
        """
        if self._pending is not None:
            raise self._error("cannot fork while a step is open; commit() or rollback() it first")
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin

    def rebind(self, handle, after_step: bool = False) -> list:
        """Keep ``handle(array)`` for the state and each snapshot instead (session/lock.py);
        returns the new arrays. ``after_step``: only what a step's outputs read, the state
        and the newest snapshot (the state before it): older snapshots were handled by the
        step that made them newest and are the store's alone; a fork or a restore needs all."""
        self._state = handle(self._state)
        older = len(self._snapshots) - 1 if after_step else 0
        fresh = [(p, handle(s)) for p, s in self._snapshots[older:]]
        self._snapshots = [*self._snapshots[:older], *fresh]
        return [a for a in (self._state, *(s for _, s in fresh)) if a is not None]

    def describe(self) -> dict:
        """What the store holds (JSON-ready), beside the KV stores' ``describe``."""
        state = self._state
        return {"layer": self.info.layer_id, "kind": self.kind, "length": self.length,
                "shape": list(self.info.shape),
                "dtype": self.info.dtype if state is None else str(state.dtype).rsplit(".")[-1],
                "bytes": self.nbytes, "snapshots": [p for p, _ in self._snapshots],
                "snapshot_bytes": sum(0 if a is None else a.nbytes for _, a in self._snapshots)}

    snapshot_names = ("state",)  # its tensor in a cache file: layer.<id>.state

    def snapshot(self) -> tuple[dict, dict]:
        """The committed state as (info, {'state': ndarray [1, C, K - 1]}) for a cache file
        (bfloat16 as its uint16 bit pattern; zeros before the first step). Snapshots of
        earlier positions are not saved: a restored store rewinds only to 0.

        Raises:
            CacheError: a step is open.
        """
        if self._pending is not None:
            raise self._error("cannot save while a step is open")
        state = self._state
        if state is None:
            state = mx.zeros(self.info.shape, dtype=getattr(mx, self.info.dtype))
        dtype = str(state.dtype).rsplit(".", 1)[-1]
        if state.dtype == mx.bfloat16:
            state = state.view(mx.uint16)
        info = {"kind": self.kind, "length": self.length, "shape": list(self.info.shape),
                "dtype": dtype}
        return info, {"state": np.array(state)}

    def check_snapshot_shapes(self, info: dict, shapes: dict) -> None:
        """Refuse a snapshot from its header alone: its state must have this layer's shape.

        Raises:
            CacheError: it does not.
        """
        if info.get("kind") != self.kind or tuple(shapes.get("state", ())) != self.info.shape:
            raise self._error(f"the snapshot's {info.get('kind')} {list(shapes.get('state', ()))}"
                              f" is not this layer's {self.kind} {list(self.info.shape)}")

    def checked_snapshot(self, info: dict, arrays: dict) -> tuple:
        """Check a snapshot against this store; returns what ``load_snapshot`` takes.

        Raises:
            CacheError: another kind, shape or dtype, or a step is open. Nothing changes.
        """
        if self._pending is not None:
            raise self._error("cannot load a snapshot while a step is open")
        arr = arrays.get("state")
        dtype = _DTYPES.get(info.get("dtype"))
        self.check_snapshot_shapes(info, {"state": getattr(arr, "shape", ())})
        if dtype is None or not isinstance(arr, np.ndarray) or arr.dtype != _NUMPY[dtype]:
            raise self._error(f"the snapshot's state is not {info.get('dtype')} as its header says")
        state = mx.array(arr)
        return info["length"], state.view(mx.bfloat16) if dtype == mx.bfloat16 else state

    def load_snapshot(self, state: tuple) -> None:
        """Replace the state with a ``checked_snapshot`` result (cannot fail)."""
        self.reset()
        self.length, self._state = state

    def _error(self, what: str) -> CacheError:
        return CacheError(f"layer {self.info.layer_id} ({type(self).__name__}): {what}")
