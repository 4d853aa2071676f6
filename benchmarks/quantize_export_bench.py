"""Quantized export against mlx-lm's convert: wall time and peak memory on the same folder.

    python benchmarks/quantize_export_bench.py [--size small] [--modes q4,q8] [--runs 1]
        [--workdir DIR] [--json]

The folder is the generate benchmark's Llama of ``--size`` (``small``: ~156M parameters,
seeded random float32 weights, benchmarks/engines/make_hf_folder.py; reused when its
stamp matches), with tiny-code's tokenizer (mlx-lm's convert needs one). Per mode, one
after the other in the same run, each as its users run it from a shell (default
settings, a fresh process, imports included):

- ``mlxgraph export FOLDER -o OUT --quantize q4|q8`` (group size 64, the default);
- ``python -m mlx_lm convert --hf-path FOLDER --mlx-path OUT -q [--q-bits 8]`` (mlx-lm's
  defaults: 4 bits, group size 64).

Printed per command: wall seconds and peak resident memory (the child's own ``ru_maxrss``
from ``wait4``; this process imports neither torch nor MLX, so no large parent's peak is
inherited across fork), and mlxgraph's time and memory as ratios to mlx-lm's of the same
mode and run (the issue's goal: both within 2x), with the load average before and after,
and mlxgraph's seconds per step (its ``--json`` summary's timings; the rest of its wall time
is the interpreter's start-up and imports: torch, transformers).
``--runs N`` keeps each command's fastest run (and its peak memory, the largest seen).
The folder's files are read once first, so neither command pays the disk for the other.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from generate_figures import COMMON, SIZES
from machine import cpu_model, load_average

from mlxgraph.exporter.builtin_names import TRAINED_BUILTINS  # (no torch: a path)

HERE = Path(__file__).resolve().parent
MODES = {"q4": 4, "q8": 8}


def commands(folder: Path, out: Path, mode: str) -> dict:
    """{engine: argv} exporting ``folder`` at ``mode`` into ``out`` (which must not exist)."""
    # the console script users call, beside this interpreter
    cli = Path(os.path.abspath(sys.executable)).with_name("mlxgraph")
    mlxgraph = [str(cli)] if cli.is_file() else [sys.executable, "-m", "mlxgraph"]
    bits = [] if mode == "q4" else ["--q-bits", str(MODES[mode])]
    return {
        # (--json: the same export, its summary as JSON, read for the steps' seconds)
        "mlxgraph": [*mlxgraph, "export", str(folder), "-o", str(out / "model.mlxg"),
                     "--quantize", mode, "--json"],
        "mlx-lm": [sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(folder),
                   "--mlx-path", str(out / "mlx"), "-q", *bits],
    }


def run_child(argv: list, out: Path) -> dict:
    """Run ``argv`` with ``out`` created fresh; its wall seconds and peak RSS bytes."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        out_text, err = stdout.read().decode(errors="replace"), stderr.read().decode(
            errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"quantize_export_bench: {argv[0]} ... failed "
                         f"(exit {proc.returncode}):\n{err[-2000:]}")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    result = {"seconds": seconds, "peak_rss_bytes": usage.ru_maxrss * 1024, "out_bytes": size}
    if "--json" in argv:  # mlxgraph's own seconds per step; the rest is start-up and imports
        stats = json.loads(out_text)
        steps = {k: round(v, 2) for k, v in stats["timings"].items()}
        result["steps"] = {"start-up and imports": round(stats["seconds"] - sum(steps.values()),
                                                         2),
                           **steps, "exit": round(seconds - stats["seconds"], 2)}
    return result


def build_folder(size: str, work: Path) -> Path:
    """The size's HF folder (a torch child process; reused when already built), with
    tiny-code's tokenizer: mlx-lm's convert saves the folder's tokenizer and needs one."""
    folder = work / f"hf-{size}"
    config = json.dumps({**SIZES[size], **COMMON})
    subprocess.run([sys.executable, str(HERE / "engines" / "make_hf_folder.py"), str(folder),
                    "--config", config], check=True)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TRAINED_BUILTINS["tiny-code"] / file, folder / file)
    for f in folder.glob("*.safetensors"):  # into the page cache before either reads it
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    return folder


def measure(folder: Path, work: Path, modes: list, runs: int) -> list:
    """One row per (mode, engine): best seconds, peak RSS, output bytes, load around it."""
    rows = []
    for mode in modes:
        for engine, argv in commands(folder, work / "out", mode).items():
            load_before = load_average()
            results = [run_child(argv, work / "out") for _ in range(runs)]
            best = min(results, key=lambda r: r["seconds"])
            rows.append({"mode": mode, "engine": engine, "seconds": best["seconds"],
                         "peak_rss_bytes": max(r["peak_rss_bytes"] for r in results),
                         "out_bytes": best["out_bytes"], "steps": best.get("steps"),
                         "load_before": load_before,
                         "load_after": load_average(), "argv": argv})
    shutil.rmtree(work / "out", ignore_errors=True)
    return rows


def ratios(rows: list) -> dict:
    """{mode: {"time": mlxgraph / mlx-lm seconds, "memory": likewise peak RSS}}."""
    out = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        by = {r["engine"]: r for r in rows if r["mode"] == mode}
        if {"mlxgraph", "mlx-lm"} <= set(by):
            out[mode] = {"time": by["mlxgraph"]["seconds"] / by["mlx-lm"]["seconds"],
                         "memory": by["mlxgraph"]["peak_rss_bytes"]
                         / by["mlx-lm"]["peak_rss_bytes"]}
    return out


def print_report(doc: dict) -> None:
    """The table of a --json document (benchmarks/figures.py prints it)."""
    print(f"{doc['cpu']}, {doc['cpus']} CPUs; load average {doc['load_start']:.2f} at the "
          f"start, {doc['load_end']:.2f} at the end")
    print(f"folder: {doc['size']} Llama, {doc['parameters'] / 1e6:.0f}M parameters, float32 "
          f"safetensors {doc['folder_bytes'] / 1e6:.0f} MB; best of {doc['runs']} run(s)")
    print(f"{'mode':<5} {'engine':<9} {'seconds':>8} {'peak RSS':>9} {'output':>9} "
          f"{'load':>10}")
    for r in doc["rows"]:
        print(f"{r['mode']:<5} {r['engine']:<9} {r['seconds']:8.2f} "
              f"{r['peak_rss_bytes'] / 1e9:7.2f}GB {r['out_bytes'] / 1e6:7.0f}MB "
              f"{r['load_before']:4.1f}->{r['load_after']:<4.1f}")
    for r in doc["rows"]:
        if r.get("steps"):
            print(f"{r['mode']} mlxgraph seconds by step: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in r["steps"].items()))
    for mode, r in doc["ratios"].items():
        print(f"{mode}: mlxgraph / mlx-lm: time {r['time']:.2f}x, peak memory "
              f"{r['memory']:.2f}x (goal: both at most 2x)")


def _parameters(size: str) -> int:
    c = {**SIZES[size], **COMMON}
    h, ffn, layers, vocab = (c["hidden_size"], c["intermediate_size"],
                             c["num_hidden_layers"], c["vocab_size"])
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * ffn + 2 * h
    return layers * per_layer + 2 * vocab * h + h


def main(argv=None) -> int:
    """Build the folder, run both converters per mode, print the table or JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small", choices=list(SIZES))
    ap.add_argument("--modes", default="q4,q8", help="comma-separated: q4,q8")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--workdir", default=None, help="where the folder is built and kept")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes) or args.runs < 1:
        ap.error("--modes takes q4 and/or q8; --runs at least 1")
    try:
        import mlx_lm  # noqa: F401  (only whether it is installed: the peer runs in a child)
    except ImportError:
        print("quantize_export_bench: mlx-lm is not installed: PIP_CONSTRAINT=requirements.lock "
              "pip install mlx-lm", file=sys.stderr)
        return 2
    load_start = load_average()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="qexport-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    folder = build_folder(args.size, work)
    rows = measure(folder, work, modes, args.runs)
    doc = {"cpu": cpu_model(), "cpus": os.cpu_count(), "size": args.size,
           "parameters": _parameters(args.size), "runs": args.runs,
           "folder_bytes": sum(f.stat().st_size for f in folder.glob("*.safetensors")),
           "rows": rows, "ratios": ratios(rows), "load_start": load_start,
           "load_end": load_average()}
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
