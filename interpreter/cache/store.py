"""Off-graph KV cache: one store per attention layer, owned by a session.

A step is ``begin(T)`` (may the step happen? checked before anything changes), then
``update(k, v)`` (stage the write, return what the queries attend to), then ``commit()``
or ``rollback()``. Staging rather than writing in place means a failed step leaves the
store exactly as it was, and once committed the old buffer is referenced only by the
lazy graph, so MLX donates it to the write (in place, O(T) not O(context)). Commit before
evaluating the step's outputs, or the write has to copy. Nothing here evaluates: every
shape decision is made from host ints.

Two stores share one slot mechanism (position ``p`` lives in slot ``p % slots``):
``FlatStore`` keeps the whole history up to a hard capacity and never wraps;
``RingStore`` keeps ``window + max_step - 1`` slots, enough for a step of up to
``max_step`` tokens to write in place without overwriting a key its own earlier queries
still need. A larger step is linearised (history and new keys concatenated in order)
and the ring rebuilt from the result, so it is slower but still exact.

A latent-attention layer (``values_in_keys``, format 1.3: MLA's absorbed form) stores its
keys alone: each value is the first ``v_head_dim`` columns of its key, so ``update`` returns
a view of the keys as the values and every buffer of values below is None.
"""

from __future__ import annotations

import mlx.core as mx

from mlxgraph.interpreter.cache.kv_codec import make_codec
from mlxgraph.interpreter.cache.layout import (
    Mask,
    grown,
    ordered_mask,
    read_slots,
    slot_mask,
    slot_positions,
    write_slots,
)
from mlxgraph.interpreter.cache.state import StoreState
from mlxgraph.interpreter.cache.types import CacheError, CachePolicy
from mlxgraph.schema.records import LayerCacheInfo

_FIRST_ALLOC = 256  # dynamic stores start here (or at the first step's size) and double


def stored_dims(geometry: LayerCacheInfo) -> tuple:
    """The row widths a store keeps per position and head: (head_dim, v_head_dim), or
    (head_dim,) when the values are a prefix of the keys (latent attention)."""
    if geometry.values_in_keys:
        return (geometry.head_dim,)
    return (geometry.head_dim, geometry.v_head_dim)


def _maybe(fn, x):
    """``fn(x)``, or None for a store's absent values buffer."""
    return None if x is None else fn(x)


class KVStore(StoreState):
    """History of one layer's keys and values; see the module docstring for the protocol.

    Attributes:
        length: tokens seen so far == the absolute position the next token must have.
        geometry, policy: what the store was made from.
        window, chunk: attention window the store applies (0 = full history), chunk (0 = none).
    """

    def __init__(self, geometry: LayerCacheInfo, policy: CachePolicy, slots: int, window: int):
        self.geometry = geometry
        self.policy = policy
        self.window = window
        self.chunk = geometry.attention_chunk
        self._slots = slots  # slot modulus, and the most slots ever allocated
        # The tensors a snapshot (and a saved file) holds per layer: keys alone for latent
        # attention, whose values are read from them.
        self.snapshot_names = ("keys", "values")[:len(stored_dims(geometry))]
        self._codec = make_codec(stored_dims(geometry), policy.kv_dtype, policy.kv_bits,
                                 policy.kv_group_size)
        self.reset()

    # -- protocol ---------------------------------------------------------------------

    def reset(self) -> None:
        """Forget all history (and any open step) and free the buffers."""
        self.length = 0
        self._oldest = 0  # oldest position whose k/v is still held
        self._keys: mx.array | None = None
        self._values: mx.array | None = None
        self._dtype = self._codec.storage_dtype
        self._batch: int | None = None
        self._pending: int | None = None
        self._staged: tuple | None = None

    def begin(self, n_new: int) -> None:
        """Open a step of ``n_new`` tokens at position ``length``.

        Raises:
            CacheError: a step is already open, ``n_new`` is not a positive int, or the
                step does not fit (flat store over capacity). Nothing changes then.
        """
        if self._pending is not None:
            raise self._error("a step is already open; commit() or rollback() it first")
        if not isinstance(n_new, int) or isinstance(n_new, bool) or n_new < 1:
            raise self._error(f"step size must be a positive int, got {n_new!r}")
        self._check_fits(n_new)
        self._pending = n_new

    def update(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array, Mask]:
        """Stage this step's keys/values and return what its queries attend to.

        Args:
            k: ``[B, kv_heads, T, head_dim]`` new keys (RoPE applied); its dtype is the
                compute dtype.
            v: ``[B, kv_heads, T, v_head_dim]`` new values.

        Returns:
            ``(keys [B, kv_heads, S, head_dim], values [B, kv_heads, S, v_head_dim], mask)``
            in k's dtype; mask is None, ``"causal"`` (lower-right aligned) or a bool
            ``[T, S]`` array (True = may attend). If no step is open, ``begin(T)`` is
            called first.

        Raises:
            CacheError: wrong shapes, batch or T, a write already staged, or (implicit
                begin) the step does not fit. The store is unchanged.
        """
        t = self._check_inputs(k, v)
        if self._staged is not None:
            raise self._error("update() already called in this step; commit() or rollback()")
        if self._pending is None:
            self.begin(t)
        elif t != self._pending:
            raise self._error(f"begin({self._pending}) but update() got T={t} tokens")
        compute = k.dtype
        dtype = self._dtype if self._dtype is not None else compute
        codec = self._codec
        if self.geometry.values_in_keys:
            keys, _, mask, self._staged = self._stage(codec.encode(k, dtype), None, dtype)
            keys = codec.decode(keys, 0, compute)
            return keys, keys[..., : self.geometry.v_head_dim], mask
        keys, values, mask, self._staged = self._stage(codec.encode(k, dtype),
                                                       codec.encode(v, dtype), dtype)
        return codec.decode(keys, 0, compute), codec.decode(values, 1, compute), mask

    def commit(self) -> None:
        """Make the staged write the store's state (``length += T``).

        Raises:
            CacheError: nothing was staged (no ``update`` since ``begin``).
        """
        if self._staged is None:
            raise self._error("commit() without a staged update()")
        keys, values, length, oldest, dtype, batch = self._staged
        # Dropping the references to the old buffers here is what lets MLX donate them.
        self._keys, self._values = keys, values
        self.length, self._oldest, self._dtype, self._batch = length, oldest, dtype, batch
        self._pending = self._staged = None

    def rollback(self) -> None:
        """Drop the open step (if any); the store is exactly as before ``begin``."""
        self._pending = self._staged = None

    def trim(self, n: int) -> int:
        """Rewind ``n`` tokens: the next step continues at position ``length - n``.

        Returns:
            The new length.

        Raises:
            CacheError: a step is open, ``n`` is negative, or the store no longer holds
                the keys the rewound position needs (the message gives the maximum).
        """
        if self._pending is not None:
            raise self._error("cannot trim while a step is open")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise self._error(f"trim needs a non-negative int, got {n!r}")
        most = self.max_trim
        if n > most:
            raise self._error(
                f"cannot rewind {n} tokens from length {self.length}: it holds positions "
                f"{self._oldest}..{self.length - 1} and window {self.window}, so it can "
                f"rewind at most {most}"
            )
        self.length -= n
        return self.length

    def relative_positions(self) -> mx.array:
        """Key position minus query position, int32 ``[T, S]``, for the queries of the step
        staged now and the keys its ``update`` returned (ALiBi's distance,
        docs/architecture.md#alibi); lazy, from host ints.

        Raises:
            CacheError: no update is staged.
        """
        if self._staged is None:
            raise self._error("relative_positions() without a staged update()")
        first, n = self._key_layout
        if first is None:   # a whole ring, its slots out of order
            keys = slot_positions(n, self.length + self._pending)
        else:
            keys = first + mx.arange(n, dtype=mx.int32)
        queries = self.length + mx.arange(self._pending, dtype=mx.int32)
        return keys[None, :] - queries[:, None]

    # -- introspection ----------------------------------------------------------------

    @property
    def max_trim(self) -> int:
        """Largest ``n`` that ``trim(n)`` accepts now."""
        if self._oldest == 0:
            return self.length
        # A rewound position L needs keys L-window+1 .. L-1, so oldest <= L-window+1.
        return self.length - (self._oldest + self.window - 1)

    @property
    def state(self) -> tuple[mx.array, ...]:
        """The committed buffers, e.g. for ``mx.async_eval(out, *store.state)``."""
        return tuple(b for b in (self._keys, self._values) if b is not None)

    # -- internals --------------------------------------------------------------------

    def _error(self, what: str) -> CacheError:
        return CacheError(f"layer {self.geometry.layer_id} ({type(self).__name__}): {what}")

    def _check_fits(self, n_new: int) -> None:
        """Raise CacheError if a step of n_new tokens cannot be taken (subclass hook)."""

    def _check_inputs(self, k: mx.array, v: mx.array) -> int:
        """The step's token count T, once k and v are what the store takes."""
        g = self.geometry
        ks, vs = k.shape, v.shape  # (each read of .shape builds a new tuple)
        if len(ks) != 4 or len(vs) != 4:
            raise self._error(f"k and v must be 4-D [B, H, T, D], got {ks} and {vs}")
        want_k = (g.kv_heads, g.head_dim)
        # Latent attention's node names its keys as v too (the values are read from them).
        want_v = want_k if g.values_in_keys else (g.kv_heads, g.v_head_dim)
        if (ks[1], ks[3]) != want_k or (vs[1], vs[3]) != want_v:
            raise self._error(
                f"expected k [B, {g.kv_heads}, T, {g.head_dim}] and v [B, {g.kv_heads}, T, "
                f"{want_v[1]}], got {ks} and {vs}"
            )
        if ks[0] != vs[0] or ks[2] != vs[2]:
            raise self._error(f"k {ks} and v {vs} disagree on B or T")
        if self._batch is not None and ks[0] != self._batch:
            raise self._error(
                f"batch {ks[0]} but the cache holds batch {self._batch}; reset() first"
            )
        if not mx.issubdtype(k.dtype, mx.floating) or not mx.issubdtype(v.dtype, mx.floating):
            raise self._error(f"k/v must be floating point, got {k.dtype} and {v.dtype}")
        return ks[2]

    def _alloc_size(self, needed: int) -> int:
        """Slots to allocate so that ``needed`` slots exist (never past ``_slots``)."""
        have = 0 if self._keys is None else self._keys.shape[2]
        if needed <= have:
            return have
        if self.policy.preallocate:
            return self._slots
        return min(self._slots, max(needed, 2 * have, _FIRST_ALLOC))

    def _buffers(self, batch: int, size: int, dtype: mx.Dtype) -> tuple:
        """The key and value buffers grown to ``size`` slots (values None: keys alone)."""
        heads, widths = self.geometry.kv_heads, self._codec.widths
        keys = grown(self._keys, (batch, heads, size, widths[0]), dtype)
        if len(widths) == 1:
            return keys, None
        return keys, grown(self._values, (batch, heads, size, widths[1]), dtype)

    def _stage(self, k: mx.array, v: mx.array, dtype: mx.Dtype):
        """Build the staged state and the attention inputs; k/v already in storage dtype."""
        batch, _, t, _ = k.shape
        start, slots, w = self.length, self._slots, self.window
        end = start + t
        first_needed = max(0, start - w + 1) if w else 0
        if end - slots > first_needed:
            return self._stage_linear(k, v, dtype)
        size = self._alloc_size(min(slots, end))
        buf_k, buf_v = self._buffers(batch, size, dtype)
        buf_k = write_slots(buf_k, k, start, slots)
        if buf_v is not None:
            buf_v = write_slots(buf_v, v, start, slots)
        oldest = max(self._oldest, end - slots)
        first = max(oldest, first_needed)
        lo, n = first % slots, end - first
        if lo + n <= size:
            # The keys the step needs sit in order in one run of slots: a view.
            keys = buf_k[:, :, lo : lo + n]
            values = None if buf_v is None else buf_v[:, :, lo : lo + n]
            mask = ordered_mask(first, n, start, t, w, self.chunk)
            self._key_layout = (first, n)
        else:
            keys, values = buf_k, buf_v
            mask = slot_mask(slots, end, start, t, w, self.chunk)
            self._key_layout = (None, slots)
        return keys, values, mask, (buf_k, buf_v, end, oldest, dtype, batch)

    def _stage_linear(self, k: mx.array, v: mx.array, dtype: mx.Dtype):
        """A step too long to write in place: attend over history + k in order, rebuild."""
        start, t, slots, w = self.length, k.shape[2], self._slots, self.window
        end = start + t
        # The first query's oldest key; the store still holds it (trim and every write
        # keep oldest <= start - window + 1), and the rebuilt ring needs only newer ones.
        first = max(0, start - w + 1)
        if start > first:
            old_k = read_slots(self._keys, first, start - first, slots)
            k = mx.concatenate([old_k, k], axis=2)
            v = _maybe(lambda x: mx.concatenate(
                [read_slots(self._values, first, start - first, slots), x], axis=2), v)
        mask = ordered_mask(first, end - first, start, t, w, self.chunk)
        self._key_layout = (first, end - first)
        # The last `slots` positions become the ring: rotate them so that position p
        # sits in slot p % slots. The concatenation makes fresh contiguous buffers, so
        # the old ring is dropped at commit.
        oldest = end - slots
        shift = oldest % slots
        cut = end - first - shift
        def rotated(x):
            return mx.concatenate([x[:, :, cut:, :], x[:, :, end - first - slots : cut, :]],
                                  axis=2)

        buf_k, buf_v = rotated(k), _maybe(rotated, v)
        return k, v, mask, (buf_k, buf_v, end, oldest, dtype, k.shape[0])


class FlatStore(KVStore):
    """Whole history up to ``policy.capacity`` tokens, static or grown by doubling."""

    kind = "flat"

    def _live_slots(self) -> int:
        return self.length  # slot == position: nothing past the length is ever read

    def _check_fits(self, n_new: int) -> None:
        if self.length + n_new > self._slots:
            raise self._error(
                f"a step of {n_new} tokens at length {self.length} exceeds the capacity of "
                f"{self._slots} tokens (room for {self._slots - self.length} more)"
            )


class RingStore(KVStore):
    """Sliding window in ``window + max_step - 1`` slots; any step size is exact."""

    kind = "ring"
