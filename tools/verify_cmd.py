"""`mlxgraph verify FILE [--deep] [--element-limit N] [--json]`: is this a valid graph file?

Exit 0 and ``FILE: valid (format 1.0, N nodes, M constants, X MB)`` on stdout; exit 1 and
one line ``FILE: invalid: <reason>`` on stderr; exit 2 when the file cannot be read.
"""

import sys

from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.reader import read_file
from mlxgraph.schema.verifier import peek_version, verify_report
from mlxgraph.tools.file_kind import looks_like
from mlxgraph.tools.output import fail, json_header_for, positive_count, print_json, printable


def add_arguments(parser) -> None:
    """Declare verify's arguments."""
    parser.add_argument("file", metavar="GRAPH.mlxg", help="the graph file")
    parser.add_argument(
        "--deep",
        action="store_true",
        help="also hash every constant and compare with its recorded hash",
    )
    parser.add_argument(
        "--element-limit", type=positive_count, default=None, metavar="N",
        help="the most elements one tensor of a step may have (default: the file's own limit, "
             "as mlxgraph.load(path, element_limit=N))",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the result as JSON (docs/json-output.md)"
    )


def _mb(n: int) -> str:
    mb = n / 1e6
    return f"{mb:.1f}" if mb >= 10 else f"{mb:.3g}"


def run(args) -> int:
    """Verify one file; returns 0 valid, 1 invalid, 2 unreadable."""
    try:
        data, size, constants = read_file(args.file)
    except OSError as e:
        return fail(f"verify: {printable(args.file)}: cannot read: {e.strerror or e}")
    try:
        report = verify_report(data, path=args.file, deep=args.deep, size=size, constants=constants,
                               element_limit=args.element_limit)
    except GraphFormatError as e:
        if args.json:
            version = peek_version(data)
            print_json({**json_header_for(None if version is None else "{}.{}".format(*version)),
                        "file": args.file, "valid": False, "deep": args.deep,
                        "error": {"node": e.node, "field": e.field, "reason": e.reason}})
        kind = looks_like(args.file) if e.node is None else None
        reason = "not a graph file: " + kind if kind else e.detail
        print(f"{printable(args.file)}: invalid: {printable(reason)}", file=sys.stderr)
        return 1
    finally:
        constants.close()
    if args.json:
        print_json(
            {
                **json_header_for(report.format_version),
                "file": args.file,
                "valid": True,
                "deep": args.deep,
                "producer": report.producer,
                "nodes": report.nodes,
                "tensors": report.tensors,
                "constants": report.constants,
                "bytes": report.bytes,
                "flatbuffer_bytes": report.flatbuffer_bytes,
                "constant_bytes": report.constant_bytes,
            }
        )
        return 0
    print(f"{printable(args.file)}: valid (format {report.format_version}, {report.nodes} nodes, "
          f"{report.constants} constants, {_mb(report.bytes)} MB)")
    return 0
