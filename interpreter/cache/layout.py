"""Buffer mechanics behind the KV stores: slot writes, reads, growth and attention masks.

A store keeps K (or V) in one buffer ``[B, H, A, D]`` whose axis 2 holds token slots.
Position ``p`` lives in slot ``p % modulus``: a flat store's modulus is its capacity (so
slots never wrap and slot == position), a ring's is its slot count. Every function here
is a pure function of host ints and lazy MLX arrays: nothing evaluates, so a whole step
stays one lazy graph.
"""

from __future__ import annotations

import mlx.core as mx

Mask = None | str | mx.array


def write_slots(buf: mx.array, seq: mx.array, first_pos: int, modulus: int) -> mx.array:
    """Return a new buffer equal to ``buf`` with ``seq`` written at positions ``first_pos..``.

    Args:
        buf: ``[B, H, A, D]`` slot buffer (not modified).
        seq: ``[B, H, n, D]`` tokens in position order, already in ``buf``'s dtype.
        first_pos: absolute position of ``seq[:, :, 0]``.
        modulus: slot modulus; ``n <= modulus`` and the slots written must lie below ``A``.

    Returns:
        The updated buffer (lazy). At most two slice updates: one if the run does not
        cross the end of the ring, two if it wraps.

    Raises:
        ValueError: from MLX if a slot range falls outside the buffer (a caller bug).
    """
    n = seq.shape[2]
    start = first_pos % modulus
    first = min(n, modulus - start)
    # A fresh handle on the same lazy array: the setitem below rebinds only this handle,
    # so `buf` (still owned by the store until commit) is untouched. Once the store
    # drops `buf` at commit, only the graph references it and MLX donates its memory
    # to the update: the write costs O(n), not O(A). A reshape to its own shape is that
    # handle without a graph node (``mx.array(buf)`` adds a cast node to every write).
    out = buf.reshape(buf.shape)
    if first == n:  # the common case: no wrap, no extra slicing of seq
        out[:, :, start : start + n, :] = seq
    else:
        out[:, :, start:, :] = seq[:, :, :first, :]
        out[:, :, : n - first, :] = seq[:, :, first:, :]
    return out


def read_slots(buf: mx.array, first_pos: int, n: int, modulus: int) -> mx.array:
    """Return positions ``first_pos .. first_pos+n-1`` of ``buf`` in position order.

    Args:
        buf: ``[B, H, A, D]`` slot buffer.
        first_pos: first absolute position wanted.
        n: how many consecutive positions (``0 <= n <= modulus``).
        modulus: slot modulus.

    Returns:
        ``[B, H, n, D]``: a view when the run does not wrap, else a concatenation of the
        two pieces (a copy; only used on the rare linearising path).
    """
    start = first_pos % modulus
    if start + n <= buf.shape[2]:
        return buf[:, :, start : start + n, :]
    head = buf[:, :, start:, :]
    return mx.concatenate([head, buf[:, :, : n - head.shape[2], :]], axis=2)


def grown(buf: mx.array | None, shape: tuple[int, int, int, int], dtype: mx.Dtype) -> mx.array:
    """Return a buffer of ``shape`` holding ``buf``'s slots at the same indices.

    Args:
        buf: current buffer or None (nothing allocated yet).
        shape: ``[B, H, A_new, D]`` with ``A_new >= buf.shape[2]``.
        dtype: storage dtype.

    Returns:
        ``buf`` itself when already that size, zeros when ``buf`` is None, else ``buf``
        followed by zero slots (one copy of ``buf``; amortised by doubling).
    """
    if buf is None:
        return mx.zeros(shape, dtype=dtype)
    extra = shape[2] - buf.shape[2]
    if extra == 0:
        return buf
    pad = mx.zeros((*shape[:2], extra, shape[3]), dtype=dtype)
    return mx.concatenate([buf, pad], axis=2)


def oldest_visible(query: int, window: int, chunk: int) -> int:
    """The oldest key position a query at ``query`` may see (window 0 / chunk 0 = no limit).

    Non-decreasing in ``query``: the last query of a step sees the least far back.
    """
    oldest = 0
    if window:
        oldest = query - window + 1
    if chunk:
        oldest = max(oldest, query - query % chunk)
    return oldest


def ordered_mask(first_key: int, n_keys: int, first_query: int, n_queries: int, window: int,
                 chunk: int = 0) -> Mask:
    """Mask for keys at consecutive positions whose last key is the last query.

    Args:
        first_key: position of key 0; keys run to ``first_query + n_queries - 1``.
        n_keys: number of keys S.
        first_query: position of query 0; queries are consecutive.
        n_queries: number of queries T.
        window: sliding window (0 = full): query p sees keys j with ``p - window < j <= p``.
        chunk: chunked attention (0 = none): query p sees keys j with ``j // chunk == p // chunk``.

    Returns:
        None when every query may see every key, ``"causal"`` when MLX's lower-right
        aligned causal mask is exact, else a bool ``[T, S]`` array (True = may attend).
    """
    last_query = first_query + n_queries - 1
    # Does the first / last query see every key from first_key on?
    first_sees_all = first_key >= oldest_visible(first_query, window, chunk)
    last_sees_all = first_key >= oldest_visible(last_query, window, chunk)
    if n_queries == 1 and first_sees_all:
        return None
    if last_sees_all:
        return "causal"
    keys = first_key + mx.arange(n_keys, dtype=mx.int32)[None, :]
    return _band(keys, first_query, n_queries, window, chunk)


def slot_mask(modulus: int, end: int, first_query: int, n_queries: int, window: int,
              chunk: int = 0) -> Mask:
    """Mask over a whole ring buffer whose slots hold positions out of order.

    Args:
        modulus: number of slots S (the buffer is exactly this long).
        end: one past the newest position written (``first_query + n_queries``); slot
            ``s`` holds the unique position in ``[end - S, end)`` congruent to ``s``.
        first_query: position of query 0; queries are consecutive.
        n_queries: number of queries T.
        window: sliding window (> 0). Slots whose content is stale (left behind by a
            trim) map to positions before the first query's window, so the band that
            the window draws already hides them.
        chunk: chunked attention (0 = none), as in :func:`ordered_mask`.

    Returns:
        None when the single query may see every slot, else a bool ``[T, S]`` array.
    """
    base = end - modulus
    if n_queries == 1 and base >= oldest_visible(first_query, window, chunk):
        # Every slot is inside the window; softmax ignores key order.
        return None
    return _band(slot_positions(modulus, end)[None, :], first_query, n_queries, window, chunk)


def slot_positions(modulus: int, end: int) -> mx.array:
    """The position each slot of a whole ring buffer holds: int32 ``[S]``, slot ``s`` the
    one position in ``[end - S, end)`` congruent to ``s`` (a stale slot maps to a position
    before every window, so masks hide it)."""
    base = end - modulus
    pivot = base % modulus
    slots = mx.arange(modulus, dtype=mx.int32)
    # Slots below the pivot hold the newest positions (they were written after wrapping).
    return slots + (base - pivot) + modulus * (slots < pivot).astype(mx.int32)


def _band(keys: mx.array, first_query: int, n_queries: int, window: int,
          chunk: int = 0) -> mx.array:
    """Bool ``[T, S]``: key position <= query position, inside the window and the
    query's chunk if any."""
    queries = first_query + mx.arange(n_queries, dtype=mx.int32)[:, None]
    mask = keys <= queries
    if window:
        mask = mask & (keys > queries - window)
    if chunk:
        mask = mask & (keys >= queries - queries % chunk)
    return mask
