"""`mlxgraph compare A B --prompt-ids 1,2,3`: run both graphs, name the first node that diverges.

Exit 0 when every aligned node stays within its tolerance at every step, 1 when one does
not, 2 on bad usage, an unreadable file or graphs of different vocabularies, 3 when a graph
fails while running.
"""

import sys

from mlxgraph.tools.align import Flow, align
from mlxgraph.tools.node_text import short_name
from mlxgraph.tools.numeric import RTOL
from mlxgraph.tools.output import (
    ToolError,
    check_vocab,
    fail,
    fmt_num,
    json_header,
    non_negative_int,
    open_checked,
    parse_ids,
    positive_float,
    print_json,
)


def add_arguments(parser) -> None:
    """Declare compare's arguments."""
    parser.add_argument("a", metavar="A.mlxg", help="the reference graph file")
    parser.add_argument("b", metavar="B.mlxg", help="the graph file measured against it")
    parser.add_argument(
        "--prompt-ids", required=True, help="prompt token ids, comma separated (e.g. 1,2,3)"
    )
    parser.add_argument(
        "--steps", type=non_negative_int, default=4,
        help="greedy decode steps after the prefill (default 4)",
    )
    parser.add_argument(
        "--rtol",
        type=positive_float,
        default=None,
        help="relative tolerance for floating outputs (default: by dtype, see docs/json-output.md)",
    )
    parser.add_argument(
        "--top", type=non_negative_int, default=10,
        help="how many of the worst nodes to list (default 10)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the result as JSON (docs/json-output.md)"
    )


def run(args) -> int:
    """Compare two graph files numerically; returns 0 (no divergence), 1 (diverged), 2 (bad
    input) or 3 (a graph failed while running)."""
    from mlxgraph.interpreter.errors import GraphRuntimeError, SessionError
    from mlxgraph.interpreter.program import Program
    from mlxgraph.schema.errors import GraphFormatError
    from mlxgraph.tools.compare_run import precision, run_compare

    try:
        ids = parse_ids(args.prompt_ids)
        if args.steps < 0:
            raise ToolError(f"--steps must be >= 0, got {args.steps}")
        ga, gb = open_checked(args.a), open_checked(args.b)
        va, vb = ga.metadata.vocab_size, gb.metadata.vocab_size
        if va != vb:
            # Fed the same ids, two vocabularies mean two different texts: any agreement is false.
            raise ToolError(
                f"{args.a} has a vocabulary of {va}, {args.b} of {vb}: compare runs "
                "graphs of the same model (the same token ids must mean the same text)"
            )
        for g, p in ((ga, args.a), (gb, args.b)):
            check_vocab(ids, g.metadata.vocab_size, p)
        pa, pb = Program.load(args.a), Program.load(args.b)
    except ToolError as e:
        return fail(f"compare: {e}")
    except GraphFormatError as e:
        return fail(f"compare: {e}")
    fa, fb = Flow(ga), Flow(gb)
    pairs = align(fa, fb)
    try:
        result = run_compare(
            pa,
            pb,
            pairs,
            ids,
            args.steps,
            rtol=args.rtol,
            precision_a=precision(fa),
            precision_b=precision(fb),
        )
    except (GraphRuntimeError, SessionError) as e:
        print(f"mlxgraph: compare: {e}", file=sys.stderr)
        return 3
    except GraphFormatError as e:
        return fail(f"compare: {e}")
    doc = report(ga, gb, pairs, result, ids, args)
    if args.json:
        print_json({**json_header({"a": ga, "b": gb}), **doc})
    else:
        print_text(doc, args.top)
    return 1 if doc["diverged"] else 0


def _node(ga, s) -> dict:
    rec = ga.nodes[s.a]
    p = rec.provenance
    return {
        "a": s.a,
        "b": s.b,
        "op": short_name(rec.op),
        "dtype_a": s.dtype_a,
        "dtype_b": s.dtype_b,
        "max_abs": s.max_abs,
        "max_rel": s.max_rel,
        "tolerance": s.tol,
        "worst_step": s.worst_step,
        "first_step_exceeded": s.first_step,
        "note": s.note,
        "provenance": {"module_path": p.module_path, "source": p.source, "target": p.target},
    }


def report(ga, gb, pairs, result, ids, args) -> dict:
    """The JSON-ready report of a comparison (docs/json-output.md)."""
    nodes = [_node(ga, result["nodes"][a]) for a in sorted(result["nodes"])]
    first = None
    if result["first"] is not None:
        step, a = result["first"]
        first = dict(_node(ga, result["nodes"][a]), step=step)
    return {
        "files": {"a": str(args.a), "b": str(args.b)},
        "prompt_ids": ids,
        "steps": args.steps,
        "tokens": {"a": result["tokens"], "b": result["tokens_b"]},
        "tolerance": {"rtol": args.rtol, "by_dtype": dict(RTOL), "integers": 0.0},
        "aligned": len(nodes),
        "unmatched": {
            "a": [a for a, b in pairs if b is None],
            "b": [b for a, b in pairs if a is None],
        },
        "diverged": first is not None,
        "first_divergent": first,
        "nodes": nodes,
    }


def _row(n) -> str:
    p = n["provenance"]
    prov = " ".join(x for x in (p["module_path"], p["source"], p["target"]) if x)
    dt = n["dtype_a"] if n["dtype_a"] == n["dtype_b"] else f"{n['dtype_a']}/{n['dtype_b']}"
    note = f"  ({n['note']})" if n["note"] else ""
    return (
        f"  a{n['a']:<5} b{n['b']:<5} {n['op']:<16} {dt or '-':<16} {fmt_num(n['max_abs']):>10} "
        f"{fmt_num(n['max_rel']):>10} {fmt_num(n['tolerance']):>8} {n['worst_step']!s:>4}  "
        f"{prov}{note}"
    )


def print_text(doc, top: int) -> None:
    """Print the comparison for a person."""
    print(f"A: {doc['files']['a']}\nB: {doc['files']['b']}")
    un = doc["unmatched"]
    print(
        f"aligned {doc['aligned']} nodes; {len(un['a'])} only in A, {len(un['b'])} only in B (not "
        "compared)"
    )
    print(
        f"prompt {len(doc['prompt_ids'])} tokens, then {doc['steps']} greedy decode steps (step 0 "
        "is the prefill)"
    )
    agree = "agree" if doc["tokens"]["a"] == doc["tokens"]["b"] else "DISAGREE"
    print(
        f"greedy tokens: A {doc['tokens']['a']}  B {doc['tokens']['b']}  ({agree}; both are fed "
        "A's)"
    )
    tol = doc["tolerance"]
    if tol["rtol"] is not None:
        print(f"tolerance: max rel {tol['rtol']:g} for floating outputs (--rtol), integers exact")
    else:
        print(
            "tolerance: max rel "
            + ", ".join(f"{k} {v:g}" for k, v in tol["by_dtype"].items())
            + " (the less precise side's), integers exact"
        )
    f = doc["first_divergent"]
    if f is None:
        print("no divergence: every aligned node is within tolerance at every step")
    else:
        p = f["provenance"]
        print(
            f"FIRST DIVERGENT NODE: a{f['a']} (b{f['b']}) {f['op']} at step {f['step']}: "
            f"max abs {fmt_num(f['max_abs'])}, max rel {fmt_num(f['max_rel'])} > "
            f"{fmt_num(f['tolerance'])} "
            f"({f['dtype_a']} vs {f['dtype_b']})"
        )
        print(
            f"  provenance: module {p['module_path'] or '-'}, source {p['source'] or '-'}, target "
            f"{p['target'] or '-'}"
        )
    differing = [n for n in doc["nodes"] if n["max_abs"] > 0]
    if not differing:
        print("every aligned output is bitwise equal")
        return
    worst = sorted(
        differing,
        key=lambda n: -(n["max_rel"] / n["tolerance"] if n["tolerance"] else float("inf")),
    )
    print(
        f"{len(differing)} aligned nodes differ; the worst (max over steps, relative to their "
        "tolerance):\n"
        f"  {'a':<6} {'b':<6} {'op':<16} {'dtype':<16} {'max abs':>10} {'max rel':>10} {'tol':>8} "
        f"{'step':>4}  provenance"
    )
    for n in worst[: max(top, 0)]:
        print(_row(n))
