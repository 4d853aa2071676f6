"""`mlxgraph cache inspect FILE` and `mlxgraph cache diff A B`: saved KV cache files.

inspect: per layer the stored tokens, kind (flat, ring; wrapped or not), dtype or bits,
bytes. diff: per layer and position range the max absolute and relative difference of
keys and values, and the first position where they diverge beyond ``--tolerance``.
Exit codes: 0 (inspect ok; diff same), 1 (diff different), 2 (unreadable file, bad usage).
"""

from mlxgraph.tools.output import fail, fmt_num, human_bytes, json_header_for, print_json

DEFAULT_TOLERANCE = 1e-3
DEFAULT_BLOCK = 256


def add_arguments(p) -> None:
    """Add cache's sub-subcommands."""
    sub = p.add_subparsers(dest="cache_command", metavar="{inspect,diff}", required=True)
    ins = sub.add_parser("inspect", help="what a saved cache file holds, per layer")
    ins.add_argument("file", help="a cache file (session.save / generate --prompt-cache)")
    ins.add_argument(
        "--json", action="store_true", help="print one JSON document (docs/json-output.md)"
    )
    dif = sub.add_parser("diff", help="per layer and position range differences of two cache files")
    dif.add_argument("a", help="the reference cache file")
    dif.add_argument("b", help="the cache file compared with it")
    dif.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="a position diverges when max|a-b| / max|a| over its heads and dims exceeds this "
        f"(default {DEFAULT_TOLERANCE})",
    )
    dif.add_argument(
        "--block",
        type=int,
        default=DEFAULT_BLOCK,
        help=f"positions per reported range (default {DEFAULT_BLOCK})",
    )
    dif.add_argument(
        "--json", action="store_true", help="print one JSON document (docs/json-output.md)"
    )


def run(args) -> int:
    """Run ``cache inspect`` or ``cache diff``; returns the exit code."""
    from mlxgraph.interpreter.cache.file import CacheFile
    from mlxgraph.interpreter.errors import CacheFileError
    from mlxgraph.tools.cache_view import diff_caches, file_view

    name = f"cache {args.cache_command}"
    if args.cache_command == "diff" and (args.block < 1 or not args.tolerance >= 0):
        return fail(f"{name}: --block must be >= 1 and --tolerance >= 0")
    try:
        files = [
            CacheFile(f)
            for f in ((args.file,) if args.cache_command == "inspect" else (args.a, args.b))
        ]
        if args.cache_command == "inspect":
            view = file_view(files[0])
        else:  # reads the tensors: a file changed meanwhile, or too large, is refused here
            result = diff_caches(files[0], files[1], args.tolerance, args.block)
    except CacheFileError as e:
        return fail(f"{name}: {e}")
    if args.cache_command == "inspect":
        if args.json:
            print_json({**json_header_for(None), "file": args.file, **view})
        else:
            _print_view(args.file, view)
        return 0
    if args.json:
        print_json({**json_header_for(None), "a": args.a, "b": args.b, **result})
    else:
        _print_diff(args.a, args.b, result)
    return 0 if result["same"] else 1


def _storage(la: dict) -> str:
    return f"{la['bits']}-bit/g{la['group_size']}" if la["bits"] else str(la["dtype"] or "-")


def _print_view(path, view: dict) -> None:
    p = view["policy"]
    print(
        f"{path}: {view['length']} tokens, {len(view['layers'])} layers, "
        f"{human_bytes(view['bytes'])} of KV "
        f"({human_bytes(view['file_bytes'])} file), "
        f"{view['bytes_per_token']} bytes per token"
    )
    print(f"graph        {view['graph'][:16]}  (fingerprint of the graph it was saved from)")
    bits = p.get("kv_bits")
    storage = f"kv_bits {bits}" if bits else f"kv_dtype {p.get('kv_dtype') or 'compute'}"
    print(
        f"policy       capacity {p.get('capacity')}, max_step {p.get('max_step')}, "
        f"{storage}"
        f"{', preallocated' if p.get('preallocate') else ''}"
    )
    print(f"token ids    {'recorded' if view['tokens_recorded'] else 'not recorded'}")
    for lid, w in view["approximations"].items():
        print(f"approximation: full-attention layer {lid} keeps only the last {w} tokens")
    print(
        f"{'layer':>5}  {'kind':<12} {'positions':>13} {'tokens':>7} {'window':>6} {'slots':>6}  "
        f"{'storage':<12} {'bytes':>10} {'per token':>9}"
    )
    for la in view["layers"]:
        if "shape" in la:  # a recurrent state: no positions, one tensor
            print(f"{la['layer']:>5}  {la['kind']:<12} {'-':>13} {'-':>7} {'-':>6} {'-':>6}  "
                  f"{la['dtype']:<12} {human_bytes(la['bytes']):>10}  state {la['shape']}")
            continue
        kind = la["kind"] + (" wrapped" if la["wrapped"] else "")
        # A latent-attention layer holds its keys alone (each value is its key's prefix).
        latent = "  keys only (latent)" if la["values_in_keys"] else ""
        span = f"{la['first_position']}..{la['length'] - 1}" if la["tokens"] else "-"
        print(
            f"{la['layer']:>5}  {kind:<12} {span:>13} {la['tokens']:>7} "
            f"{la['window'] or 'full':>6} "
            f"{la['slots']:>6}  {_storage(la):<12} {human_bytes(la['bytes']):>10} "
            f"{la['bytes_per_token'] or '-':>9}{latent}"
        )


def _print_diff(a, b, r: dict) -> None:
    print(f"A {a}: {r['length']['a']} tokens\nB {b}: {r['length']['b']} tokens")
    if not r["same_graph"]:
        print("note: the two files were saved from different graphs")
    for la in r["layers"]:
        if "missing_in" in la:
            print(f"layer {la['layer']}: only in {'B' if la['missing_in'] == 'a' else 'A'}")
            continue
        if "state_max_abs" in la:
            print(f"layer {la['layer']}: recurrent state max abs "
                  f"{fmt_num(la['state_max_abs'])}, rel {fmt_num(la['state_max_rel'])}"
                  f"{' (diverges)' if la['state_diverges'] else ''}")
            continue
        if "shape_mismatch" in la:
            print(
                f"layer {la['layer']}: shapes differ "
                f"{la['shape_mismatch'][0]} vs {la['shape_mismatch'][1]}"
            )
            continue
        span = (
            "no common positions"
            if la["positions"] is None
            else f"positions {la['positions'][0]}..{la['positions'][1]} compared"
        )
        first = la["first_divergence"]
        verdict = (
            "no divergence"
            if first is None
            else f"first diverges at position {first['position']} (rel {fmt_num(first['rel'])})"
        )
        print(f"layer {la['layer']}: {span}; {verdict}")
        for rg in la["ranges"]:
            print(
                f"  {rg['positions'][0]:>6}..{rg['positions'][1]:<6} "
                f"keys abs {fmt_num(rg['keys_max_abs']):>9} "
                f"rel {fmt_num(rg['keys_max_rel']):>9}   "
                f"values abs {fmt_num(rg['values_max_abs']):>9} "
                f"rel {fmt_num(rg['values_max_rel']):>9}"
            )
    where = "none" if r["first_divergence"] is None else f"position {r['first_divergence']}"
    print(
        f"{'same' if r['same'] else 'different'} "
        f"(tolerance {r['tolerance']}; first divergence: {where})"
    )
