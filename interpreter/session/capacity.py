"""A session's default capacity: the model's own maximum context, bounded by memory.

The model's maximum is its ``max_position_embeddings`` (metadata ``extra``, a string the
exporter writes), else the graph's ``max_context`` (the largest step it was traced for),
else DEFAULT_CAPACITY. A full cache of that many tokens must fit in 1/MEMORY_SHARE of what
the process can allocate (a growing cache holds its old and its new buffer for a moment
while it doubles); past that the capacity is the largest power of two that fits, so a
small change in free memory does not change it (a saved cache records its capacity).
"""

from mlxgraph.interpreter.memory import allocatable_bytes
from mlxgraph.interpreter.session.options import MAX_CAPACITY

DEFAULT_CAPACITY = 4096  # a graph that records no maximum at all
MEMORY_SHARE = 2
AS_ASKED = "as asked"


def model_maximum(meta) -> tuple:
    """(tokens, where that number comes from) of the model's own maximum context."""
    raw = (meta.extra or {}).get("max_position_embeddings", "")
    try:
        tokens = int(raw)
    except (TypeError, ValueError):
        tokens = 0
    if 1 <= tokens <= MAX_CAPACITY:
        return tokens, "the model's max_position_embeddings"
    if 0 < meta.max_context <= MAX_CAPACITY:
        return int(meta.max_context), "the graph's max context"
    return DEFAULT_CAPACITY, "the default: the graph records no maximum"


def bytes_per_token(layers: dict, windows: dict, itemsize: int, kv_bits: int,
                    group: int) -> float:
    """Bytes one more token of history costs: the layers whose store grows with the
    capacity (full attention without a window; a ring or a chunk holds a fixed number)."""
    element = kv_bits / 8 + 8 / max(group, 1) if kv_bits else itemsize  # + scales, biases
    return sum(lc.kv_heads * (lc.head_dim + lc.v_head_dim) * element
               for lid, lc in layers.items() if not windows[lid] and not lc.attention_chunk)


def default_capacity(program, windows: dict, itemsize: int, kv_bits: int, group: int,
                     room=None) -> tuple:
    """(capacity, why) of a session that was given none.

    Args:
        program: the Program; windows: the session's {layer_id: window};
        itemsize: bytes of a stored element (the kv dtype's, else 4); kv_bits, group: the
            quantized cache's (kv_bits 0: floats).
        room: bytes the process may allocate (None: allocatable_bytes(), now).
    """
    tokens, why = model_maximum(program.metadata)
    per_token = bytes_per_token(program.layers, windows, itemsize, kv_bits, group)
    room = allocatable_bytes() if room is None else room
    if not per_token or room is None or tokens * per_token * MEMORY_SHARE <= room:
        return tokens, why
    fits = max(1, int(room // (per_token * MEMORY_SHARE)))
    capacity = 1 << (fits.bit_length() - 1)
    return capacity, (f"memory: {why} is {tokens}, whose cache ({tokens * per_token / 2**30:.2f}"
                      f" GiB) would take more than 1/{MEMORY_SHARE} of the "
                      f"{room / 2**30:.2f} GiB this process can allocate")


__all__ = ["AS_ASKED", "DEFAULT_CAPACITY", "MEMORY_SHARE", "bytes_per_token",
           "default_capacity", "model_maximum"]
