"""`mlxgraph diff A B`: aligned node-stream diff of two graph files (exit 0 same, 1 different)."""

from mlxgraph.tools.graph_diff import diff_graphs
from mlxgraph.tools.output import (
    ToolError,
    fail,
    fmt_num,
    json_header,
    open_checked,
    print_json,
    shape_str,
)


def add_arguments(parser) -> None:
    """Declare diff's arguments."""
    parser.add_argument("a", metavar="A.mlxg", help="the reference graph file")
    parser.add_argument("b", metavar="B.mlxg", help="the graph file compared with it")
    parser.add_argument(
        "--json", action="store_true", help="print the result as JSON (docs/json-output.md)"
    )
    parser.add_argument("--no-stats", action="store_true",
                        help="skip the numeric max abs/rel differences of changed constants")


def run(args) -> int:
    """Diff two graph files; returns 0 (same), 1 (different) or 2 (unreadable file)."""
    try:
        ga, gb = open_checked(args.a), open_checked(args.b)
    except ToolError as e:
        return fail(f"diff: {e}")
    result = diff_graphs(ga, gb, stats=not args.no_stats)
    if args.json:
        files = {
            k: {
                "path": str(p),
                "producer": g.producer,
                "nodes": len(g.nodes),
                "constants": len(g.constants),
            }
            for k, p, g in (("a", args.a, ga), ("b", args.b, gb))
        }
        print_json({**json_header({"a": ga, "b": gb}), "files": files, **result})
    else:
        print_text(args.a, ga, args.b, gb, result)
    return 0 if result["same"] else 1


def _v(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, list):
        return shape_str(x)
    return str(x)


def _fields(fields) -> str:
    return "; ".join(f"{f['field']}: {_v(f['a'])} -> {_v(f['b'])}" for f in fields)


def _tensor(t) -> str:
    return "-" if t is None else f"{t['dtype']}{shape_str(t['shape'])}"


def print_text(path_a, ga, path_b, gb, r) -> None:
    """Print the diff for a person: header, each section with entries, then a summary line."""
    from mlxgraph.tools.output import version_string

    for mark, path, g in (("---", path_a, ga), ("+++", path_b, gb)):
        print(f"{mark} {path}  (format {version_string(g)}, {g.producer or '?'}, "
              f"{len(g.nodes)} nodes, {len(g.constants)} constants)")
    if r["metadata"]:
        print("metadata:")
        for f in r["metadata"]:
            print(f"  ~ {f['field']}: {_v(f['a'])} -> {_v(f['b'])}")
    for section in ("inputs", "outputs"):
        if r[section]:
            print(f"{section}:")
            for e in r[section]:
                detail = (
                    _fields(e["fields"])
                    if e["change"] == "changed"
                    else f"{_tensor(e['a'])} -> {_tensor(e['b'])}"
                )
                print(f"  {_MARK[e['change']]} {e['name']}: {detail}")
    s = r["summary"]
    if r["nodes"]:
        print(f"nodes: {s['inserted']} inserted, {s['deleted']} deleted, {s['changed']} changed "
              f"({s['dtype_only']} of them casts or dtype changes only), {s['aligned']} aligned")
        for n in r["nodes"]:
            if n["change"] == "inserted":
                print(f"  + b{n['text']}")
            elif n["change"] == "deleted":
                print(f"  - a{n['text']}")
            else:
                where = f"  # {n['module_path']}" if n["module_path"] else ""
                print(f"  ~ a{n['a']} b{n['b']}  {n['op']}  {_fields(n['fields'])}{where}")
    if r["constants"]:
        print(f"constants: {len(r['constants'])} differ")
        for c in r["constants"]:
            a, b = c["a"], c["b"]
            name = (
                (a or b)["name"]
                if a is None or b is None or a["name"] == b["name"]
                else f"{a['name']} / {b['name']}"
            )
            line = f"  {_MARK[c['change']]} {name}  {_tensor(a)} -> {_tensor(b)}"
            if a is not None and b is not None and a["hash"] != b["hash"]:
                line += f"  hash {a['hash'][:12]} -> {b['hash'][:12]}"
            if "max_abs_diff" in c:
                line += (
                    f"  max abs {fmt_num(c['max_abs_diff'])}, max rel {fmt_num(c['max_rel_diff'])}"
                )
            print(line)
    if r["same"]:
        print(f"same: {s['aligned']} nodes aligned, nothing differs")
    else:
        parts = [f"{s[k]} {k}" for k in ("inserted", "deleted", "changed") if s[k]]
        if s["dtype_only"] and s["dtype_only"] == s["inserted"] + s["deleted"] + s["changed"]:
            parts[-1] += " (all casts or dtype changes only)"
        parts += [
            f"{s[k]} {k} difference(s)"
            for k in ("metadata", "inputs", "outputs", "constants")
            if s[k]
        ]
        print("different: " + ", ".join(parts))


_MARK = {"added": "+", "inserted": "+", "removed": "-", "deleted": "-", "changed": "~"}
