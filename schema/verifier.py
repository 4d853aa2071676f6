"""The graph-file verifier: is this buffer a graph file this mlxgraph can safely read?

Order of the checks: the file identifier; the root table and its version (a newer major
gets a clear "newer mlxgraph needed" error before anything else is judged); the constant
segment's place against the file size; the whole FlatBuffer part, structurally
(schema/verify_structure.py); then the graph's meaning (schema/verify_semantics.py).
A buffer that passes can be read by schema/reader.py without any exception. Every fault
is a GraphFormatError naming the file and, where it applies, the node and the field.
"""

import struct
from dataclasses import dataclass

from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.format import (
    ALIGNMENT,
    FILE_IDENTIFIER,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    MAX_FLATBUFFER_BYTES,
)
from mlxgraph.schema.verify_bounds import StepBounds, check_bounds
from mlxgraph.schema.verify_layers import check_layers
from mlxgraph.schema.verify_plans import table_plans
from mlxgraph.schema.verify_quantized import check_quantized
from mlxgraph.schema.verify_semantics import check_graph
from mlxgraph.schema.verify_states import check_states
from mlxgraph.schema.verify_structure import Bad, Walker


@dataclass(frozen=True)
class VerifyReport:
    """What a valid file holds, for `mlxgraph verify`."""

    format_version: str
    producer: str
    nodes: int
    tensors: int
    constants: int
    bytes: int
    flatbuffer_bytes: int
    constant_bytes: int
    bounds: StepBounds        # what the interpreter checks at run time


def verify_buffer(data, path=None, deep: bool = False) -> None:
    """Verify a whole graph file held in memory (bytes or memoryview).

    Args:
        data: the file's bytes.
        path: the file name for messages (None: "<bytes>").
        deep: also check each constant's bytes against its hash.
    Raises:
        GraphFormatError: the first fault found.
    """
    verify_report(data, path, deep)


def verify_report(data, path=None, deep: bool = False, size=None, constants=None,
                  element_limit=None) -> VerifyReport:
    """Like :func:`verify_buffer`, returning a summary of the valid file.

    Args:
        data: the file's bytes, or (with ``size``) at least its FlatBuffer part.
        size: the whole file's size (default ``len(data)``).
        constants: what reads constant bytes for ``deep`` (``.read(offset, length)``);
            default: slices of ``data``.
        element_limit: the most elements a tensor of a step may have (None: the file's
            default, schema/verify_bounds.py).
    Raises:
        GraphFormatError: the first fault found.
    """
    if constants is None:
        from mlxgraph.schema.file_source import MemoryConstants

        constants = MemoryConstants(data)
    try:
        return _verify(data, len(data) if size is None else size, deep, constants, element_limit)
    except GraphFormatError as e:
        raise e.located(path=path) from None
    except (
        struct.error,
        IndexError,
        KeyError,
        ValueError,
        TypeError,
        OverflowError,
        RecursionError,
    ) as e:
        # A check this verifier lacks; still a bad file, so still the one error type.
        raise GraphFormatError(
            f"malformed file (unchecked fault {type(e).__name__}: {e})", path
        ) from None


def peek_segment_offset(data) -> int | None:
    """Where a buffer's FlatBuffer part claims to end, or None when that cannot be read
    from ``data`` (too short, or the root table lies past it)."""
    try:
        walker = Walker(data, min(len(data), MAX_FLATBUFFER_BYTES), _unknown((0, 0)))
        if bytes(data[4:8]) != FILE_IDENTIFIER:
            return None
        return walker.scalars(walker.root(), table_plans()["Graph"])["segment_offset"]
    except (Bad, struct.error, IndexError, ValueError):
        return None


def peek_version(data) -> tuple | None:
    """The (major, minor) a buffer claims, or None when it cannot be read safely."""
    try:
        walker = Walker(data, min(len(data), MAX_FLATBUFFER_BYTES), _unknown((0, 0)))
        if bytes(data[4:8]) != FILE_IDENTIFIER:
            return None
        s = walker.scalars(walker.root(), table_plans()["Graph"])
    except (Bad, struct.error, IndexError, ValueError):
        return None
    if s["version_major"] is None or s["version_minor"] is None:
        return None
    return s["version_major"], s["version_minor"]


def _unknown(version):
    ours = f"{FORMAT_MAJOR}.{FORMAT_MINOR}"
    theirs = f"{version[0]}.{version[1]}"

    def message(what: str, code: int) -> str:
        if version > (FORMAT_MAJOR, FORMAT_MINOR):
            return (
                f"{what} {code} unknown to this mlxgraph (format {ours}): the file was written "
                f"by a newer mlxgraph (format {theirs})"
            )
        return (
            f"{what} {code} unknown: format {theirs}, which the file claims, has no such {what}"
        )
    return message


def _located(e: Bad) -> GraphFormatError:
    """A structural fault as GraphFormatError: the node index under chains[0].nodes, else a
    field path."""
    parts = e.parts[::-1]
    node = None
    if parts[:3] == ["chains", "[0]", "nodes"] and len(parts) > 3:
        node = int(parts[3][1:-1])
        parts = parts[4:]
        if parts[:1] == ["op"] and len(parts) > 1:
            parts = parts[1:]
    field = (
        "".join(p if p.startswith("[") or i == 0 else "." + p for i, p in enumerate(parts)) or None
    )
    return GraphFormatError(e.reason, node=node, field=field)


def _verify(data, size: int, deep: bool, constants, element_limit) -> VerifyReport:
    if size < 8 or len(data) < 8:
        raise GraphFormatError(f"file too short to be a graph file ({size} bytes)")
    ident = bytes(data[4:8])
    if ident != FILE_IDENTIFIER:
        raise GraphFormatError(
            f"not a graph file: identifier {ident!r}, expected {FILE_IDENTIFIER!r}"
        )
    plan = table_plans()["Graph"]
    try:
        probe = Walker(data, min(len(data), size, MAX_FLATBUFFER_BYTES), _unknown((0, 0)))
        root = probe.root()
        head = probe.scalars(root, plan)
    except Bad as e:
        raise _located(e) from None
    for name in ("version_major", "version_minor", "segment_offset", "segment_length"):
        if head[name] is None:
            raise GraphFormatError("required field is missing", field=name)
    version = (head["version_major"], head["version_minor"])
    _check_version(version)
    seg, seg_len = head["segment_offset"], head["segment_length"]
    if seg > size:
        raise GraphFormatError(
            f"file truncated: it has {size} bytes, its FlatBuffer part alone takes {seg}",
            field="segment_offset",
        )
    if seg % ALIGNMENT or not root < seg <= MAX_FLATBUFFER_BYTES:
        raise GraphFormatError(
            f"segment_offset {seg} is not a {ALIGNMENT}-byte aligned end of the FlatBuffer "
            f"part within the file ({size} bytes)",
            field="segment_offset",
        )
    if seg + seg_len > size:
        raise GraphFormatError(
            f"file truncated: it has {size} bytes, its constant segment ends at byte "
            f"{seg + seg_len}",
            field="segment_length",
        )
    if seg + seg_len < size:
        raise GraphFormatError(f"{size - seg - seg_len} extra bytes after the constant segment, "
                               f"which ends at byte {seg + seg_len}", field="segment_length")
    try:
        graph = Walker(data, seg, _unknown(version)).table(root, plan)
    except Bad as e:
        raise _located(e) from None
    if seg > len(data):
        raise GraphFormatError(f"the FlatBuffer part ({seg} bytes) was not read whole",
                               field="segment_offset")
    fixed = check_graph(graph, constants, deep)
    bounds = check_bounds(graph, fixed, element_limit)
    check_quantized(graph)
    check_layers(graph)
    check_states(graph, bounds.element_limit)
    return VerifyReport(
        f"{version[0]}.{version[1]}",
        graph.producer.decode("utf-8", "replace") if graph.producer else "",
        len(graph.chains[0].nodes),
        len(graph.tensors),
        len(graph.constants or ()),
        size,
        seg,
        seg_len,
        bounds,
    )


def _check_version(version) -> None:
    major, minor = version
    if major > FORMAT_MAJOR:
        raise GraphFormatError(
            f"format {major}.{minor} is newer than this mlxgraph reads (format {FORMAT_MAJOR}."
            f"{FORMAT_MINOR} and older): a newer mlxgraph, one that reads format {major}.x, "
            "is needed",
            field="version_major",
        )
    if major < 1:
        raise GraphFormatError(
            f"format {major}.{minor} was never released (the first is 1.0)", field="version_major"
        )
