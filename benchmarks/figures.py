"""`make figures`: the peer comparisons the docs quote, measured again and written to
docs/figures.md with the command, date, machine and load beside each table.

    python benchmarks/figures.py [--only generate,quantized] [--out docs/figures.md]

Each benchmark runs in its own process with ``--json``; its table is printed from that
document by the benchmark's own printer, so the file shows exactly what the command prints.
README.md and docs/ cite this file instead of copying its numbers.
"""

import argparse
import contextlib
import importlib
import io
import json
import os
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
# name -> (script and arguments, "module.function" printing its --json document, what it
# shows). The printers are imported only when a table is printed: the benchmarks' imports
# stay out of this process.
FIGURES = {
    "generate": (
        ["generate_bench.py", "--sizes", "tiny,small", "--contexts", "", "--rounds", "2",
         "--runs", "2", "--engines", "mlxgraph,mlxgraph-cli,mlx-lm,mlx-lm+openblas,transformers"],
        "generate_report.print_report",
        "float32 generation: mlxgraph against mlx-lm (as installed, and with mlxgraph's "
        "OpenBLAS preloaded) and transformers",
    ),
    "quantized": (
        ["quantized_bench.py", "--models", "small", "--runs", "3"],
        "quantized_bench.print_table",
        "float32, q8 and q4 weights against llama.cpp f32, q8_0 and q4_0 of the same folder",
    ),
    "quantize_export": (
        ["quantize_export_bench.py", "--size", "small", "--modes", "q4,q8", "--runs", "2"],
        "quantize_export_bench.print_report",
        "quantized export (mlxgraph export --quantize) against mlx_lm.convert -q on the same "
        "folder: time and peak memory (README, Quantized weights)",
    ),
    "batch": (
        ["batch_bench.py", "--new-tokens", "24"],
        "batch_bench.print_report",
        "batched decode (Program.step_batch) against the same sessions one after another "
        "and mlx-lm's BatchGenerator (docs/architecture.md, Batched steps)",
    ),
    "serve": (
        ["serve_bench.py"],
        "serve_bench.print_report",
        "mlxgraph serve against mlx_lm.server, 1, 4 and 16 streaming clients (docs/serve.md)",
    ),
    "session_state": (
        ["session_state_bench.py"],
        "session_state_bench.print_report",
        "fork, save/restore and quantized KV on a 4k-token cache (docs/session-state.md)",
    ),
    "perplexity": (
        ["perplexity_bench.py"],
        "perplexity_bench.print_table",
        "tiny-code's held-out loss and loss-pass speed per graph dtype and width "
        "(docs/precision.md)",
    ),
    "pipeline": (
        ["pipeline_bench.py"],
        "pipeline_bench.print_report",
        "generate --pipeline on 1, 2, 3 local ranks against one process (docs/pipeline.md)",
    ),
    "state": (
        ["state_bench.py"],
        "state_bench.print_report",
        "recurrent-state and latent-attention models (Mamba-2, Qwen3-Next, DeepSeek-V2-Lite "
        "shapes) against mlx-lm on the same folders; state bytes per session, KV bytes per "
        "token (docs/session-state.md)",
    ),
    "step_build": (
        # the files generate_bench wrote (run "generate" first, or make bench)
        ["step_build_bench.py", "--graph", "out/bench/small.mlxg", "--folder",
         "out/bench/hf-small"],
        "step_build_bench.print_report",
        "host cost of one decode step: building its lazy graph, against mlx-lm on the CPU "
        "(README, On a GPU)",
    ),
    "blas": (
        ["blas_bench.py"],
        "blas_bench.print_report",
        "the small model's products per BLAS setup: router on/off, threads, half precision "
        "(docs/generate.md)",
    ),
    "blas_shapes": (
        ["blas_shapes_bench.py"],
        "blas_shapes_bench.print_report",
        "the router's few-row kernel against sgemm, and the 1-vs-2-thread crossing (README)",
    ),
    "tile": (
        ["tile_bench.py"],
        "tile_bench.print_report",
        "the BLAS router's many-row kernel against OpenBLAS's sgemm and torch (README)",
    ),
    "matvec": (
        ["matvec_bench.py"],
        "matvec_bench.print_report",
        "float32 decode's one-row products: the router's kernel against sgemv and the "
        "machine's read bound; greedy agreement (README, Fast BLAS)",
    ),
    "norm_rope": (
        ["norm_rope_bench.py"],
        "norm_rope_bench.print_report",
        "native RMSNorm and RoPE against the MLX ops they replace (README)",
    ),
}


def printer(dotted: str):
    """The function ``module.function`` of a benchmark module, imported now."""
    module, _, name = dotted.rpartition(".")
    sys.path.insert(0, str(HERE))
    return getattr(importlib.import_module(module), name)


def run_one(name: str) -> str:
    """One benchmark's section: heading, command, when, and its printed table."""
    argv, print_name, what = FIGURES[name]
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_start = os.getloadavg()[0]  # every table's load, whether its benchmark prints it
    print(f"figures: {name}: python benchmarks/{shlex.join(argv)} ...", file=sys.stderr)
    done = subprocess.run([sys.executable, str(HERE / argv[0]), *argv[1:], "--json"],
                          stdout=subprocess.PIPE, text=True, cwd=HERE.parent)
    # quantized_bench exits 1 on a token mismatch, perplexity_bench on a loss outside its
    # tolerance: both are shown in the table.
    if done.returncode not in (0, 1):
        raise SystemExit(f"figures: {argv[0]} failed (exit {done.returncode})")
    load_end = os.getloadavg()[0]
    doc = json.loads(done.stdout)
    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        printer(print_name)(doc)
    return (f"## {name}: {what}\n\n`python benchmarks/{shlex.join(argv)}`, started {started}, "
            f"load average {load_start:.2f} at the start, {load_end:.2f} at the end"
            f"{'' if done.returncode == 0 else ' (exit 1: see the table)'}:\n\n"
            f"```text\n{table.getvalue().strip()}\n```\n")


HEADER = (
    "# Figures\n\nWritten by `make figures` (benchmarks/figures.py); do not edit by hand. "
    "Peers run as their users run them (default settings, every core); the machine's "
    "load average at the start and the end of each run is in its table: a loaded "
    "machine is reported, never compensated. Only ratios within one table mean much on "
    "a shared VM, and load does not slow every engine alike: llama.cpp's and torch's "
    "spinning threads lose the most on a busy machine (llama.cpp decoded 6-9x slower at "
    "load 5 than on a quiet machine, stop 25), so a table at load average 3-6 flatters "
    "mlxgraph against them; prefer a run at load below 1.\n\n")


def existing_sections(path: Path) -> dict:
    """{name: section} already in the figures file, so ``--only`` replaces just those."""
    if not path.is_file():
        return {}
    found = {}
    for part in path.read_text().split("\n## ")[1:]:
        name = part.split(":", 1)[0]
        if name in FIGURES:
            found[name] = "## " + part.rstrip("\n") + "\n"
    return found


def main(argv=None) -> int:
    """Run the chosen benchmarks and write the figures file."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(FIGURES), help="comma-separated: "
                    + ",".join(FIGURES))
    ap.add_argument("--out", default=str(HERE.parent / "docs" / "figures.md"))
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        print(f"figures: unknown benchmark {unknown[0]!r}", file=sys.stderr)
        return 2
    out = Path(args.out)
    sections = existing_sections(out)
    for name in names:  # written after each one: a long run cut short keeps what it measured
        sections[name] = run_one(name)
        out.write_text(HEADER + "\n".join(sections[n] for n in FIGURES if n in sections))
    print(f"figures: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
