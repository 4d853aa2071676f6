"""`mlxgraph verify FILE [--deep] [--json]`: is this a valid graph file?

Exit 0 and ``FILE: valid (format 1.0, N nodes, M constants, X MB)`` on stdout; exit 1 and
one line ``FILE: invalid: <reason>`` on stderr; exit 2 when the file cannot be read.
"""

import mmap
import sys

from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.format import format_version
from mlxgraph.schema.verifier import peek_version, verify_report
from mlxgraph.tools.output import JSON_VERSION, fail, print_json


def add_arguments(parser) -> None:
    """Declare verify's arguments."""
    parser.add_argument("file", metavar="GRAPH.mlxg", help="the graph file")
    parser.add_argument("--deep", action="store_true", help="also hash every constant and compare with its recorded hash")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (docs/json-output.md)")


def _read(path: str):
    """The file's bytes, mapped (b"" for an empty file). Raises OSError."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _where(e: GraphFormatError) -> str:
    parts = [f"node {e.node}"] if e.node is not None else []
    if e.field is not None:
        parts.append(f"field {e.field}")
    return ": ".join([*parts, e.reason])


def _mb(n: int) -> str:
    mb = n / 1e6
    return f"{mb:.1f}" if mb >= 10 else f"{mb:.3g}"


def run(args) -> int:
    """Verify one file; returns 0 valid, 1 invalid, 2 unreadable."""
    try:
        data = _read(args.file)
    except OSError as e:
        return fail(f"verify: {args.file}: cannot read: {e.strerror or e}")
    try:
        report = verify_report(data, path=args.file, deep=args.deep)
    except GraphFormatError as e:
        version = peek_version(data)
        if args.json:
            print_json({**_header(version), "file": args.file, "valid": False, "deep": args.deep,
                        "error": {"node": e.node, "field": e.field, "reason": e.reason}})
        print(f"{args.file}: invalid: {_where(e)}", file=sys.stderr)
        return 1
    finally:
        if isinstance(data, mmap.mmap):
            try:
                data.close()
            except BufferError:  # a view still alive (e.g. in a traceback): the GC unmaps it
                pass
    if args.json:
        major, minor = map(int, report.format_version.split("."))
        print_json({**_header((major, minor)), "file": args.file, "valid": True, "deep": args.deep,
                    "producer": report.producer, "nodes": report.nodes, "tensors": report.tensors,
                    "constants": report.constants, "bytes": report.bytes,
                    "flatbuffer_bytes": report.flatbuffer_bytes, "constant_bytes": report.constant_bytes})
        return 0
    print(f"{args.file}: valid (format {report.format_version}, {report.nodes} nodes, "
          f"{report.constants} constants, {_mb(report.bytes)} MB)")
    return 0


def _header(version) -> dict:
    """The keys every --json document starts with (format_version None when unreadable)."""
    return {"format_version": None if version is None else f"{version[0]}.{version[1]}",
            "json_version": JSON_VERSION, "tool_format_version": format_version()}
