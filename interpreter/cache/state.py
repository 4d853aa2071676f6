"""A KV store's committed state as a value: fork it, describe it, snapshot and reload it.

Mixed into ``KVStore`` (cache_store.py), whose attributes it reads: ``length``,
``_oldest``, ``_keys``/``_values`` (slot buffers ``[B, H, A, W]``), ``_dtype``, ``_batch``,
``_slots`` and ``_codec``.

Forking shares the buffers. That is safe because MLX arrays are values: a store never
writes into a buffer, it builds a new one (``write_slots``), and MLX only reuses an input's
memory for the output when nothing else references it. While two stores hold one buffer,
the first write of either copies it (the copy a write would otherwise alias); after that
each writes in place again. So a fork costs O(layers) now and at most one buffer copy per
store later.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlxgraph.interpreter.cache.layout import grown
from mlxgraph.interpreter.session.fork_protocol import ForksOnCopy

_DTYPES = {
    "float32": mx.float32,
    "float16": mx.float16,
    "bfloat16": mx.bfloat16,
    "uint32": mx.uint32,
}
_NAMES = {v: k for k, v in _DTYPES.items()}
# How each storage dtype travels as numpy (bfloat16 as its bit pattern).
_NUMPY = {
    mx.float32: np.dtype("<f4"),
    mx.float16: np.dtype("<f2"),
    mx.bfloat16: np.dtype("<u2"),
    mx.uint32: np.dtype("<u4"),
}


class StoreState(ForksOnCopy):
    """Fork, describe, snapshot and load_snapshot of a KV store (see module docstring)."""

    _PICKLE_ADVICE = "use fork() for a copy, Session.save(path) to keep it"

    kind = "store"

    @property
    def nbytes(self) -> int:
        """Bytes held by the committed buffers (k + v, including unused slots)."""
        return sum(b.nbytes for b in (self._keys, self._values) if b is not None)

    def preallocation_elements(self) -> int:
        """Elements of k + v a preallocated store holds (batch 1, every slot; packed uint32
        words for a quantized store)."""
        return self._slots * self.geometry.kv_heads * sum(self._codec.widths)

    @property
    def tokens_held(self) -> int:
        """Number of positions whose k/v the store holds."""
        return self.length - self._oldest

    @property
    def bytes_per_token(self) -> float:
        """``nbytes / tokens_held`` (0.0 when empty): slack of a preallocated store shows."""
        held = self.tokens_held
        return self.nbytes / held if held else 0.0

    @property
    def row_bytes(self) -> int | None:
        """What one position costs in this store: its key and value rows over every head
        (the key alone for latent attention), in the storage dtype or packed quantized
        words; None before the first step of a store whose dtype is the compute dtype."""
        if self._dtype is None:
            return None
        itemsize = np.dtype(_NUMPY[self._dtype]).itemsize
        return self.geometry.kv_heads * sum(self._codec.widths) * itemsize

    def fork(self):
        """An independent store with the same committed history (buffers shared until written).

        Raises:
            CacheError: a step is open (its staged write belongs to one history only).
        """
        if self._pending is not None:
            raise self._error("cannot fork while a step is open; commit() or rollback() it first")
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin

    def rebind(self, handle, after_step: bool = False) -> list:
        """Keep ``handle(buffer)`` for each committed buffer instead (session/lock.py: never
        an array a step's outputs read or another session holds); returns them. A step reads
        both buffers, so ``after_step`` (RecurrentState's) changes nothing here."""
        self._keys, self._values = handle(self._keys), handle(self._values)
        return list(self.state)

    def describe(self) -> dict:
        """What the store holds: kind, positions, window, storage and bytes (JSON-ready)."""
        codec = self._codec
        return {
            "layer": self.geometry.layer_id,
            "kind": self.kind,
            "wrapped": self._oldest > 0,
            "length": self.length,
            "first_position": self._oldest,
            "tokens": self.tokens_held,
            "window": self.window,
            "slots": self._slots,
            "allocated_slots": 0 if self._keys is None else self._keys.shape[2],
            "dtype": None
            if self._dtype is None
            else _NAMES[self._dtype]
            if codec.bits == 0
            else None,
            "bits": codec.bits,
            "group_size": codec.group_size if codec.bits else None,
            "values_in_keys": self.geometry.values_in_keys,
            "bytes_per_token": self.row_bytes,
            "bytes": self.nbytes,
        }

    # -- snapshot ---------------------------------------------------------------------

    def _live_slots(self) -> int:
        """Leading slots a snapshot must keep (a ring keeps them all; flat overrides)."""
        return 0 if self._keys is None else self._keys.shape[2]

    def snapshot(self) -> tuple[dict, dict]:
        """The committed state as (info, {'keys': ndarray, 'values': ndarray}).

        Arrays are ``[B, H, n, W]`` numpy copies of the live slots (bfloat16 as its
        uint16 bit pattern, quantized rows packed as uint32, see kv_codec).

        Raises:
            CacheError: a step is open.
        """
        if self._pending is not None:
            raise self._error("cannot save while a step is open")
        # window and modulus are for readers of the file (position p sits in slot p % modulus);
        # a restoring store takes them from its own policy.
        info = {
            "kind": self.kind,
            "length": self.length,
            "oldest": self._oldest,
            "batch": self._batch,
            "dtype": None if self._dtype is None else _NAMES[self._dtype],
            "slots": 0,
            "window": self.window,
            "modulus": self._slots,
        }
        if self.geometry.values_in_keys:
            # Latent attention: no values tensor, each value being its key's first columns
            # (a reader without this key refuses the layer in one line).
            info["value_width"] = self.geometry.v_head_dim
        n = self._live_slots()
        if self._keys is None or n == 0:  # (a flat store trimmed to 0 keeps its buffer)
            return info, {}
        info["slots"] = n
        arrays = {}
        for name, buf in zip(self.snapshot_names, (self._keys, self._values)):
            part = buf[:, :, :n, :]
            if part.dtype == mx.bfloat16:
                part = part.view(mx.uint16)
            arrays[name] = np.array(part)
        return info, arrays

    def check_snapshot_shapes(self, info: dict, shapes: dict) -> None:
        """Refuse a snapshot from its header alone, before its arrays are read: ``shapes``
        ({'keys', 'values'}: ``[B, H, slots, width]``) must fit this store's slots, heads
        and row widths.

        Raises:
            CacheError: they do not.
        """
        n = info.get("slots") or 0
        if n > self._slots:
            raise self._error(f"the snapshot's {n} slots do not fit {self._slots} slots")
        for name, width in zip(self.snapshot_names, self._codec.widths):
            want = (info.get("batch"), self.geometry.kv_heads, n, width)
            if n and tuple(shapes.get(name, ())) != want:
                raise self._error(
                    f"snapshot {name}: {list(shapes.get(name, ()))} does not fit this "
                    f"store's [batch, {want[1]}, {n}, {width}]")

    def checked_snapshot(self, info: dict, arrays: dict) -> tuple:
        """Check a snapshot against this store; returns the state ``load_snapshot`` takes.

        Raises:
            CacheError: the snapshot does not fit this store (kind, positions, dtype,
                shapes) or a step is open. Nothing changes.
        """
        if self._pending is not None:
            raise self._error("cannot load a snapshot while a step is open")
        return self._checked_state(info, arrays)

    def load_snapshot(self, state: tuple) -> None:
        """Replace the committed state with a ``checked_snapshot`` result (cannot fail)."""
        length, oldest, dtype, batch, keys, values = state
        self.reset()
        if keys is not None and self.kind == "flat":
            # Flat stores read views of the first `length` slots: only those are saved,
            # and the buffer gets the size this store's growth policy gives that length.
            size = self._alloc_size(keys.shape[2])
            keys = grown(keys, (*keys.shape[:2], size, keys.shape[3]), dtype)
            if values is not None:
                values = grown(values, (*values.shape[:2], size, values.shape[3]), dtype)
        self.length, self._oldest, self._dtype, self._batch, self._keys, self._values = (
            length,
            oldest,
            dtype,
            batch,
            keys,
            values,
        )

    def _checked_state(self, info: dict, arrays: dict) -> tuple:
        if info.get("kind") != self.kind:
            raise self._error(
                f"the snapshot is of a {info.get('kind')!r} store, this is a {self.kind!r} store"
            )
        width = self.geometry.v_head_dim if self.geometry.values_in_keys else None
        if info.get("value_width") != width:
            raise self._error(f"the snapshot's values are {_values_kind(info.get('value_width'))}"
                              f", this store's are {_values_kind(width)}")
        if (info.get("modulus"), info.get("window")) != (self._slots, self.window):
            raise self._error(
                f"the snapshot's ring of {info.get('modulus')} slots, window {info.get('window')} "
                f"is not this store's {self._slots} slots, window {self.window}"
            )
        length, oldest, n, batch = (info.get(k) for k in ("length", "oldest", "slots", "batch"))
        if not all(isinstance(x, int) and x >= 0 for x in (length, oldest, n)):
            raise self._error("the snapshot's length, oldest and slots must be non-negative ints")
        dtype = _DTYPES.get(info.get("dtype")) if info.get("dtype") is not None else None
        want_dtype = self._codec.storage_dtype
        if info.get("dtype") is not None and (
            dtype is None
            or (want_dtype is not None and dtype != want_dtype)
            or (self._codec.bits == 0 and dtype == mx.uint32)
        ):
            raise self._error(
                f"the snapshot stores {info.get('dtype')}, this store needs "
                f"{_NAMES.get(want_dtype, 'a float dtype')}"
            )
        if n == 0:
            if length or oldest or arrays:
                raise self._error("the snapshot holds positions but no slots")
            return 0, 0, want_dtype, None, None, None
        if n > self._slots or oldest > length or length - oldest > self._slots:
            raise self._error(
                f"the snapshot's {n} slots / positions {oldest}..{length} do not fit "
                f"{self._slots} slots"
            )
        if self.kind == "flat" and (n != length or oldest != 0):
            raise self._error(
                "a flat snapshot must hold exactly its length's slots from position 0"
            )
        if self.kind != "flat" and n < min(self._slots, length):
            raise self._error(
                f"the snapshot's {n} slots cannot hold positions {oldest}..{length - 1}"
            )
        if not isinstance(batch, int) or batch < 1 or dtype is None:
            raise self._error("the snapshot's batch must be an int >= 1 and its dtype known")
        heads, widths = self.geometry.kv_heads, self._codec.widths
        bufs = []
        for name, width in zip(self.snapshot_names, widths):
            arr = arrays.get(name)
            want = (batch, heads, n, width)
            if not isinstance(arr, np.ndarray) or arr.shape != want or arr.dtype != _NUMPY[dtype]:
                got = (
                    None
                    if arr is None
                    else (getattr(arr, "shape", None), getattr(arr, "dtype", None))
                )
                raise self._error(f"snapshot {name}: expected {want} {_NUMPY[dtype]}, got {got}")
            buf = mx.array(arr)
            bufs.append(buf.view(mx.bfloat16) if dtype == mx.bfloat16 else buf)
        return length, oldest, dtype, batch, bufs[0], bufs[1] if len(bufs) > 1 else None


def _values_kind(width) -> str:
    """How a snapshot holds its values, as a refusal says it."""
    return "a tensor of their own" if width is None else f"the first {width} columns of its keys"
