"""`make figures`: the peer comparisons the docs quote, measured again and written to
docs/figures.md with the command, date, machine and load beside each table.

    python benchmarks/figures.py [--only generate,quantized] [--out docs/figures.md]

Each benchmark runs in its own process with ``--json``; its table is printed from that
document by the benchmark's own printer, so the file shows exactly what the command prints.
README.md and docs/ cite this file instead of copying its numbers.
"""

import argparse
import contextlib
import io
import json
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from generate_report import print_report
from quantized_bench import print_table

HERE = Path(__file__).resolve().parent
# name -> (script and arguments, printer of its --json document, what it shows).
FIGURES = {
    "generate": (
        ["generate_bench.py", "--sizes", "tiny,small", "--contexts", "", "--rounds", "2",
         "--runs", "2", "--engines", "mlxgraph,mlxgraph-cli,mlx-lm,mlx-lm+openblas,transformers"],
        print_report,
        "float32 generation: mlxgraph against mlx-lm (as installed, and with mlxgraph's "
        "OpenBLAS preloaded) and transformers",
    ),
    "quantized": (
        ["quantized_bench.py", "--models", "small", "--runs", "3"],
        print_table,
        "float32, q8 and q4 weights against llama.cpp f32, q8_0 and q4_0 of the same folder",
    ),
}


def run_one(name: str) -> str:
    """One benchmark's section: heading, command, when, and its printed table."""
    argv, printer, what = FIGURES[name]
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"figures: {name}: python benchmarks/{shlex.join(argv)} ...", file=sys.stderr)
    done = subprocess.run([sys.executable, str(HERE / argv[0]), *argv[1:], "--json"],
                          stdout=subprocess.PIPE, text=True)
    if done.returncode not in (0, 1):  # quantized_bench exits 1 on a token mismatch: shown
        raise SystemExit(f"figures: {argv[0]} failed (exit {done.returncode})")
    doc = json.loads(done.stdout)
    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        printer(doc)
    return (f"## {name}: {what}\n\n`python benchmarks/{shlex.join(argv)}`, started {started}"
            f"{'' if done.returncode == 0 else ' (exit 1: see the table)'}:\n\n"
            f"```text\n{table.getvalue().strip()}\n```\n")


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
    sections = [run_one(n) for n in names]
    Path(args.out).write_text(
        "# Figures\n\nWritten by `make figures` (benchmarks/figures.py); do not edit by hand. "
        "Peers run as their users run them (default settings, every core); the machine's "
        "load average at the start and the end of each run is in its table: a loaded "
        "machine is reported, never compensated. Only ratios within one table mean much on "
        "a shared VM, and load does not slow every engine alike: llama.cpp's and torch's "
        "spinning threads lose the most on a busy machine (llama.cpp decoded 6-9x slower at "
        "load 5 than on a quiet machine, stop 25), so a table at load average 3-6 flatters "
        "mlxgraph against them; prefer a run at load below 1.\n\n" + "\n".join(sections))
    print(f"figures: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
