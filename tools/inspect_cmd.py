"""`mlxgraph inspect FILE`: a one-screen summary of a graph file, its node stream and constants."""

import os
from collections import Counter

from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.tools.node_text import SlotNames, format_node, node_json, short_name
from mlxgraph.tools.output import (
    ToolError,
    fail,
    human_bytes,
    json_header,
    open_checked,
    print_json,
    shape_str,
    version_string,
)


def add_arguments(parser) -> None:
    """Declare inspect's arguments."""
    parser.add_argument("file", metavar="GRAPH.mlxg", help="the graph file")
    parser.add_argument(
        "--nodes", action="store_true", help="also print the node stream, one node per line"
    )
    parser.add_argument("--constants", action="store_true", help="also list the constants")
    parser.add_argument(
        "--json", action="store_true", help="print the result as JSON (docs/json-output.md)"
    )


def run(args) -> int:
    """Inspect a graph file; returns 0, or 2 when it cannot be read."""
    try:
        graph = open_checked(args.file)
    except ToolError as e:
        return fail(f"inspect: {e}")
    doc = summary(graph, args.file)
    if args.json:
        names = SlotNames(graph)
        if args.nodes:
            doc["nodes"] = [node_json(i, n, names) for i, n in enumerate(graph.nodes)]
        if args.constants:
            doc["constants"] = constant_list(graph)
        print_json({**json_header({"file": graph}), **doc})
        return 0
    print_summary(doc, version_string(graph))
    if args.nodes:
        print("nodes:")
        names = SlotNames(graph)
        for i, n in enumerate(graph.nodes):
            print(format_node(i, n, names))
    if args.constants:
        print("constants:")
        for c in constant_list(graph):
            print(
                f"  {c['index']}  {c['name']}  {c['dtype']}{shape_str(c['shape'])}  {c['bytes']}  "
                f"{c['hash']}"
            )
    return 0


def cache_groups(layers, alibi=frozenset()) -> list:
    """Consecutive layers with the same cache geometry, as [{'layers': [first, last], ...}];
    ``alibi``: the layer ids whose attention node has ALiBi slopes (format 1.3)."""
    groups = []
    for lc in layers:
        geo = {"kv_heads": lc.kv_heads, "head_dim": lc.head_dim, "v_head_dim": lc.v_head_dim,
               "sliding_window": lc.sliding_window, "attention_chunk": lc.attention_chunk,
               "values_in_keys": lc.values_in_keys, "alibi": lc.layer_id in alibi}
        if groups and groups[-1]["geometry"] == geo and groups[-1]["layers"][1] == lc.layer_id - 1:
            groups[-1]["layers"][1] = lc.layer_id
        else:
            groups.append({"layers": [lc.layer_id, lc.layer_id], "geometry": geo})
    return [{"layers": g["layers"], **g["geometry"]} for g in groups]


def alibi_layers(graph) -> frozenset:
    """The layer ids of the attention nodes that add ALiBi's bias (format 1.3)."""
    return frozenset(n.fields["layer_id"] for n in graph.nodes
                     if entry(n.op).has(Trait.ATTENTION) and n.fields.get("alibi_slopes"))


def _io(graph, which) -> list:
    out = []
    for name, slot in getattr(graph, which).items():
        t = graph.tensors[slot]
        out.append({"name": name, "slot": slot, "dtype": t.dtype, "shape": list(t.shape)})
    return out


def constant_list(graph) -> list:
    """Every constant: index, name, slot, dtype, shape, bytes, hash."""
    out = []
    for k, c in enumerate(graph.constants):
        t = graph.tensors[c.tensor]
        out.append(
            {
                "index": k,
                "name": t.name,
                "slot": c.tensor,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "bytes": c.length,
                "hash": c.hash,
            }
        )
    return out


def constant_bytes(graph) -> dict:
    """Total and per-dtype constant bytes, and constants sharing content (same hash)."""
    by_dtype, by_hash = {}, {}
    for c in constant_list(graph):
        d = by_dtype.setdefault(c["dtype"], {"count": 0, "bytes": 0})
        d["count"] += 1
        d["bytes"] += c["bytes"]
        by_hash.setdefault(c["hash"], []).append(c)
    dups = [{"hash": h, "bytes": cs[0]["bytes"], "names": [c["name"] for c in cs]}
            for h, cs in by_hash.items() if len(cs) > 1]
    return {
        "total": sum(d["bytes"] for d in by_dtype.values()),
        "by_dtype": dict(sorted(by_dtype.items(), key=lambda kv: -kv[1]["bytes"])),
        "duplicates": dups,
        "duplicate_bytes": sum(d["bytes"] * (len(d["names"]) - 1) for d in dups),
    }


def quantized_groups(graph) -> list:
    """Quantized nodes grouped by op, bits and group size: [{op, bits, group_size, nodes}]."""
    groups = Counter((short_name(n.op), n.fields["bits"], n.fields["group_size"])
                     for n in graph.nodes if entry(n.op).has(Trait.QUANTIZED))
    return [{"op": op, "bits": bits, "group_size": gs, "nodes": count}
            for (op, bits, gs), count in sorted(groups.items())]


def summary(graph, path) -> dict:
    """Everything inspect shows without --nodes/--constants, as a JSON-ready dict."""
    m = graph.metadata
    ops = Counter(short_name(n.op) for n in graph.nodes)
    try:
        file_bytes = os.path.getsize(path)
    except OSError:
        file_bytes = None
    return {
        "path": str(path),
        "file_bytes": file_bytes,
        "producer": graph.producer,
        "metadata": {
            "architecture": m.architecture,
            "num_layers": m.num_layers,
            "hidden_size": m.hidden_size,
            "vocab_size": m.vocab_size,
            "max_context": m.max_context,
            "eos_token_ids": list(m.eos_token_ids),
            "bos_token_id": m.bos_token_id,
            "tokenizer": m.tokenizer,
            "extra": dict(m.extra),
            "tokenizer_files": {
                k: len(v.encode("utf-8")) for k, v in sorted(m.tokenizer_files.items())
            },
            "cache": cache_groups(m.layers, alibi_layers(graph)),
            # format 1.3: each recurrent layer's off-graph state
            "states": [{"layer": s.layer_id, "shape": list(s.shape), "dtype": s.dtype}
                       for s in m.states],
        },
        "symbols": [{"name": s.name, "min": s.min, "max": s.max} for s in graph.symbols],
        "inputs": _io(graph, "inputs"),
        "outputs": _io(graph, "outputs"),
        "counts": {
            "tensors": len(graph.tensors),
            "values": len(graph.values),
            "symbols": len(graph.symbols),
            "constants": len(graph.constants),
            "nodes": len(graph.nodes),
            "chains": graph.root.ChainsLength(),
        },
        "constant_bytes": constant_bytes(graph),
        "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "quantized": quantized_groups(graph),
    }


def _wrap(label, items, width=100) -> list:
    lines, cur = [], f"{label:<12}"
    for item in items:
        if len(cur) + len(item) + 2 > width and cur.strip() != label:
            lines.append(cur.rstrip())
            cur = " " * 12
        cur += item + "  "
    lines.append(cur.rstrip())
    return lines


def print_summary(doc, version: str) -> None:
    """Print the summary for a person, one screen."""
    m = doc["metadata"]
    size = f"  ({human_bytes(doc['file_bytes'])})" if doc["file_bytes"] is not None else ""
    print(f"{'file':<12}{doc['path']}{size}")
    print(f"{'format':<12}{version}   producer {doc['producer'] or '-'}")
    print(
        f"{'model':<12}{m['architecture'] or '-'}  layers {m['num_layers']}  hidden "
        f"{m['hidden_size']}  "
        f"vocab {m['vocab_size']}  max context {m['max_context']}  eos {m['eos_token_ids']}  "
        f"bos {m['bos_token_id']}  tokenizer {m['tokenizer'] or '-'}"
    )
    if m["tokenizer_files"]:
        files = [f"{k} ({human_bytes(n)})" for k, n in m["tokenizer_files"].items()]
        print(*_wrap("tokenizer", files), sep="\n")
    if m["extra"]:
        print(*_wrap("extra", [f"{k}={v}" for k, v in sorted(m["extra"].items())]), sep="\n")
    cache = []
    for g in m["cache"]:
        lo, hi = g["layers"]
        span = f"layer {lo}" if lo == hi else f"layers {lo}-{hi}"
        window = f"window {g['sliding_window']}" if g["sliding_window"] else "full"
        if g["attention_chunk"]:
            window = f"chunk {g['attention_chunk']}"
        # Latent attention (format 1.3): the cache keeps keys alone, values their prefix.
        latent = " values in keys" if g["values_in_keys"] else ""
        latent += " alibi" if g["alibi"] else ""
        cache.append(
            f"{span}: kv_heads {g['kv_heads']} head_dim {g['head_dim']} v_head_dim "
            f"{g['v_head_dim']}{latent} {window}"
        )
    cache = [c + ";" for c in cache[:-1]] + cache[-1:]
    print(*_wrap("kv cache", cache or ["-"]), sep="\n")
    if m["states"]:
        states = [f"layer {s['layer']}: {s['dtype']} {s['shape']}" for s in m["states"]]
        print(*_wrap("state", [s + ";" for s in states[:-1]] + states[-1:]), sep="\n")
    syms = [
        f"{s['name']} in [{s['min']}, {s['max'] if s['max'] is not None else '?'}]"
        for s in doc["symbols"]
    ]
    print(*_wrap("symbols", syms or ["-"]), sep="\n")
    for which in ("inputs", "outputs"):
        items = [f"{e['name']} {e['dtype']}{shape_str(e['shape'])}" for e in doc[which]]
        print(*_wrap(which, items or ["-"]), sep="\n")
    c = doc["counts"]
    print(
        f"{'slots':<12}{c['tensors']} tensors ({c['constants']} constants), {c['values']} values, "
        f"{c['symbols']} symbols; {c['nodes']} nodes, {c['chains']} chain(s)"
    )
    cb = doc["constant_bytes"]
    per = [f"{k} {human_bytes(v['bytes'])} ({v['count']})" for k, v in cb["by_dtype"].items()]
    print(*_wrap("constants", [f"{human_bytes(cb['total'])} total:"] + per), sep="\n")
    if cb["duplicates"]:
        dup = [
            f"{len(d['names'])}x {human_bytes(d['bytes'])} ({', '.join(d['names'])})"
            for d in cb["duplicates"]
        ]
        print(
            *_wrap("duplicates", dup + [f"{human_bytes(cb['duplicate_bytes'])} could be shared"]),
            sep="\n",
        )
    else:
        print(f"{'duplicates':<12}none")
    print(*_wrap("ops", [f"{k} {v}" for k, v in doc["ops"].items()] or ["-"]), sep="\n")
    if doc["quantized"]:
        items = [f"{q['op']} {q['nodes']}x {q['bits']}-bit group {q['group_size']};"
                 for q in doc["quantized"]]
        print(*_wrap("quantized", [*items[:-1], items[-1][:-1]]), sep="\n")
