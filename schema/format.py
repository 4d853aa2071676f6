"""Constants of the .mlxg container: identifier, format version, alignment, content hash."""

import hashlib

FILE_IDENTIFIER = b"MLXG"
FORMAT_MAJOR = 1
FORMAT_MINOR = 3
# Constants start on 64-byte boundaries so they can be mapped and viewed without a copy.
ALIGNMENT = 64
# A graph file's FlatBuffer part must fit FlatBuffers' 32-bit offsets; constants may not.
MAX_FLATBUFFER_BYTES = 2**31 - 1


def format_version() -> str:
    """The format version this mlxgraph writes, as 'major.minor'."""
    return f"{FORMAT_MAJOR}.{FORMAT_MINOR}"


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    """Round ``n`` up to a multiple of ``alignment``."""
    return (n + alignment - 1) // alignment * alignment


def content_hash(data) -> str:
    """The hex blake2b-128 digest a Constant records for its bytes."""
    return hashlib.blake2b(memoryview(data).cast("B"), digest_size=16).hexdigest()
