"""Where the BLAS router's choices cross over: few-row products and the thread threshold.

    python benchmarks/blas_shapes_bench.py [--repeats 5] [--rounds 2] [--json]

1. Few rows: MLX's x @ W.T for M = 1, 2, 4, 8, 16, 32 rows against the small model's
   1024x2816, 2816x1024 and 1024x32000 weights, router on (M == 1: sgemv; 2..8: the
   router's own kernel, interpreter/native/small_gemm.c; more: sgemm) against router off
   (OpenBLAS's sgemm for all), each at 1 and 2 threads.
2. Thread threshold: one-row products and 128-row products from 64K to 32M multiply-adds
   (the tiny and small models' weights), 1 thread against 2, router on. The default
   policy (blas_router.DEFAULT_MIN_WORK) gives a product 2 threads from where 2 wins.
Setups take turns (--rounds) in fresh processes (benchmarks/blas_bench.py's child);
printed: best times in ms and the ratios.
"""

import argparse
import json
import os
import sys

from blas_bench import run_setup

FEW_WEIGHTS = [(1024, 2816), (2816, 1024), (1024, 32000)]  # (K, N) of a Linear's W (N x K)
FEW_ROWS = [1, 2, 4, 8, 16, 32]
# (K, N) from the tiny (hidden 256, MLP 688) and small (1024, 2816) models, and LM heads
SWEEP_WEIGHTS = [(256, 256), (256, 688), (512, 512), (688, 256), (512, 1024), (1024, 1024),
                 (1024, 2816), (256, 32000), (1024, 32000)]
SWEEP_ROWS = [1, 128]


def _setup(router: str, threads: str) -> dict:
    return {"MLXGRAPH_BLAS_ROUTER": router, "MLXGRAPH_BLAS_THREADS": threads}


def measure(repeats: int, rounds: int) -> dict:
    """{part: {setup: {"float32 MxKxN": seconds}}}, best over rounds."""
    few = [[m, k, n] for k, n in FEW_WEIGHTS for m in FEW_ROWS]
    sweep = [[m, k, n] for m in SWEEP_ROWS for k, n in SWEEP_WEIGHTS]
    parts = {
        "few_rows": (few, {f"router {r} {t}t": _setup("1" if r == "on" else "0", t)
                           for r in ("on", "off") for t in ("1", "2")}),
        "threads": (sweep, {f"{t} thread{'s' * (t != '1')}": _setup("1", t) for t in ("1", "2")}),
    }
    out = {part: {} for part in parts}
    for _ in range(rounds):
        for part, (shapes, setups) in parts.items():
            for name, env in setups.items():
                times = run_setup(env, shapes, ["float32"], repeats)["times"]
                old = out[part].get(name, times)
                out[part][name] = {k: min(v, old[k]) for k, v in times.items()}
    return out


def print_report(doc) -> None:
    """The two tables."""
    few = doc["few_rows"]
    print(f"\nFew-row products (ms, best of runs); load average {doc['load_average'][0]:.1f}")
    for threads in ("1", "2"):
        on, off = few[f"router on {threads}t"], few[f"router off {threads}t"]
        print(f"  {threads} thread(s): router on / router off (sgemm) = ratio")
        for k, n in FEW_WEIGHTS:
            cells = []
            for m in FEW_ROWS:
                a, b = on[f"float32 {m}x{k}x{n}"], off[f"float32 {m}x{k}x{n}"]
                cells.append(f"M={m} {a * 1e3:.2f}/{b * 1e3:.2f}={a / b:.2f}")
            print(f"    {k}x{n}: " + "  ".join(cells))
    t1, t2 = doc["threads"]["1 thread"], doc["threads"]["2 threads"]
    print("Thread threshold, router on: 1 thread / 2 threads (ms; ratio > 1: 2 threads win)")
    for m in SWEEP_ROWS:
        for k, n in SWEEP_WEIGHTS:
            key = f"float32 {m}x{k}x{n}"
            work = m * k * n / 2**20
            print(f"    {m:>3}x{k}x{n:<6} {work:8.2f}M multiply-adds: "
                  f"{t1[key] * 1e3:8.3f} / {t2[key] * 1e3:8.3f} = {t1[key] / t2[key]:.2f}")


def main(argv=None) -> int:
    """Run both parts; print the tables (or --json)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    doc = {"benchmark": "blas_shapes", **measure(args.repeats, args.rounds),
           "load_average": os.getloadavg()}
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
