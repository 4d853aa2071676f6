"""A SentencePiece ``precompiled_charsmap`` (the Precompiled normalizer) checked before the
tokenizers library reads it.

The format is ``[u32 trie size in bytes][trie: u32 units][normalized strings, NUL-ended]``;
the library follows the trie (a darts-clone double array) byte by byte and indexes it
without bounds checks of its own that it can recover from: a unit outside the array, a
value outside the strings or inside a character, or a match ending inside a character
of the input panics or aborts the process. Every state that valid UTF-8 text can reach
is followed here (breadth first over all 256 bytes at once with numpy), so a map passes
only when no input can take the library out of bounds. The longest replacement string
gives the normalizer's growth (characters out per character in).
"""

import base64
import binascii
import struct

import numpy as np

from mlxgraph.schema.errors import Error

MAX_CHARSMAP_BYTES = 8 << 20
MAX_DEPTH = 64  # bytes in one trie key


class CharsmapError(Error, ValueError):
    """The charsmap is malformed or can lead the library out of bounds (the message says how)."""


def _units(a):
    has_leaf = (a >> 8) & 1
    label = a & ((1 << 31) | 0xFF)
    offset = (a >> 10) << ((a & (1 << 9)) >> 6)
    value = a & ((1 << 31) - 1)
    return has_leaf, label, offset, value


def charsmap_growth(encoded: str) -> int:
    """Check a base64 charsmap; returns its longest replacement in characters (at least 1).

    Raises:
        CharsmapError: not base64, sizes that do not add up, strings that are not UTF-8,
            or a trie that valid text can lead out of bounds.
    """
    if not isinstance(encoded, str) or len(encoded) > MAX_CHARSMAP_BYTES * 4 // 3 + 4:
        raise CharsmapError("precompiled_charsmap is not a string of at most "
                            f"{MAX_CHARSMAP_BYTES} bytes")
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise CharsmapError("precompiled_charsmap is not base64") from None
    if len(blob) < 8:
        raise CharsmapError("precompiled_charsmap is shorter than its header and root")
    (trie_bytes,) = struct.unpack_from("<I", blob)
    if trie_bytes % 4 or trie_bytes < 4 or trie_bytes > len(blob) - 4:
        raise CharsmapError(f"precompiled_charsmap's trie size {trie_bytes} does not fit "
                            f"its {len(blob)} bytes")
    array = np.frombuffer(blob, "<u4", trie_bytes // 4, 4).astype(np.int64)
    strings = blob[4 + trie_bytes:]
    try:
        text = strings.decode("utf-8")
    except UnicodeDecodeError:
        raise CharsmapError("precompiled_charsmap's strings are not UTF-8") from None
    _check_trie(array, strings)
    return max(1, max((len(s) for s in text.split("\0")), default=1))


def _utf8_steps():
    """[remaining continuation bytes (0-3), byte] -> remaining after it, or -1 (invalid)."""
    steps = np.full((4, 256), -1, np.int64)
    b = np.arange(256)
    steps[0, 1:0x80] = 0
    steps[0, 0xC2:0xE0] = 1
    steps[0, 0xE0:0xF0] = 2
    steps[0, 0xF0:0xF5] = 3
    cont = (b >= 0x80) & (b < 0xC0)
    for r in (1, 2, 3):
        steps[r, cont] = r - 1
    return steps


def _check_trie(array, strings: bytes) -> None:
    boundary = np.ones(len(strings) + 1, bool)  # a value may point at a character's start
    boundary[:-1] = (np.frombuffer(strings, np.uint8) & 0xC0) != 0x80
    steps = _utf8_steps()
    states = np.array([[_units(array[:1])[2][0], 0]], np.int64)  # (position, UTF-8 left)
    seen = set()
    for _ in range(MAX_DEPTH + 1):
        if not len(states):
            return
        found = [_step(array, boundary, steps, states[i:i + 4096])
                 for i in range(0, len(states), 4096)]
        fresh = {tuple(s) for f in found for s in f.tolist()} - seen
        seen |= fresh
        states = np.array(sorted(fresh), np.int64).reshape(-1, 2)
    raise CharsmapError(f"precompiled_charsmap has keys longer than {MAX_DEPTH} bytes")


def _step(array, boundary, steps, states):
    """The states one more byte of valid text reaches from ``states``; raises CharsmapError
    when a read the library makes on the way is out of bounds."""
    byte = np.arange(256, dtype=np.int64)
    pos, nxt = states[:, :1], steps[states[:, 1]]
    index = pos ^ byte  # the unit each next byte reads
    live = nxt >= 0
    live[:, 0] = False  # a NUL byte ends the key
    if (index[live] >= len(array)).any():
        raise CharsmapError("precompiled_charsmap's trie reads past its end")
    idx, left = index[live], nxt[live]
    has_leaf, label, offset, _ = _units(array[idx])
    match = label == np.broadcast_to(byte, index.shape)[live]
    child, left = idx[match] ^ offset[match], left[match]
    leaf = has_leaf[match].astype(bool)
    if leaf.any():
        at = child[leaf]
        if (at >= len(array)).any():
            raise CharsmapError("precompiled_charsmap's trie has a value past its end")
        value = _units(array[at])[3]
        if (value >= len(boundary)).any() or not boundary[value].all():
            raise CharsmapError("precompiled_charsmap's trie points outside or into the "
                                "middle of its strings")
        if (left[leaf] != 0).any():
            raise CharsmapError("precompiled_charsmap matches part of a character")
    return np.stack([child, left], axis=1)


__all__ = ["CharsmapError", "charsmap_growth"]
