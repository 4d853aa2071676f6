"""The BLAS router's many-row kernel (interpreter/native/tile_gemm.c) against the BLAS's sgemm
and torch's, over the shapes where the router chooses between them.

    python benchmarks/tile_bench.py [--repeats 60] [--threads 1,2] [--json]

MLX's x @ W.T (a Linear) for 16..512 rows against the small model's weights (1024 x 1024,
1024 x 2816, 2816 x 1024), smaller weights, and attention-sized products. The router's
kernel, OpenBLAS's sgemm (scipy-openblas32) and torch's ``F.linear`` (MKL) are timed in ONE
process, call by call in turns (the router's switch is flipped between calls; the kernel
is timed on every shape, also those where the router keeps the BLAS), with a 2 ms pause
after each call so no engine's spinning threads overlap the next: this VM's speed drifts
by up to 1.5x over seconds, so separate processes would compare spells, not kernels.
Printed: best and median ms of each, OpenBLAS/tile (> 1: the kernel is faster), and which
the router picks (blas_router.c, wants_tile). This process imports neither mlx nor torch.
"""

import argparse
import json
import os
import subprocess
import sys
import textwrap

# (M, K, N): C = x (M x K) @ W.T (W is N x K); "nn": C = x @ W (W is K x N), attention's P @ V
SHAPES = [
    (16, 1024, 1024), (32, 1024, 1024), (64, 1024, 1024), (128, 1024, 1024),
    (128, 1024, 2816), (128, 2816, 1024), (160, 1024, 1024), (192, 1024, 1024),
    (256, 1024, 1024), (512, 1024, 2816), (128, 1024, 512), (128, 512, 1024),
    (128, 256, 1024), (128, 64, 128), (512, 64, 512),
]

_CHILD = textwrap.dedent("""
    import ctypes, json, sys, time
    import mlxgraph
    info = mlxgraph.preload_blas()
    import mlx.core as mx
    import numpy as np
    import torch
    shapes, repeats, threads = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    router = ctypes.CDLL(info.router_path, mode=ctypes.RTLD_GLOBAL) if info.router_path else None
    if router is None or not router.mlxgraph_router_tile(1):
        print("RESULT " + json.dumps({"error": "no router, or no AVX-512 for its kernel",
                                      "blas": info.describe()}))
        sys.exit(0)
    out = {"blas": info.describe(), "times": {}}
    for m, k, n in shapes:
        w_np = np.random.default_rng(0).standard_normal((n, k), dtype=np.float32)
        x_np = np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)
        w, x = mx.array(w_np), mx.array(x_np)
        tw, tx = torch.from_numpy(w_np), torch.from_numpy(x_np)
        mx.eval(w, x, x @ w.T)
        torch.nn.functional.linear(tx, tw)
        times = {"tile": [], "sgemm": [], "torch": []}
        names = list(times)
        for rep in range(repeats):
            # Each engine follows each other one in turn: torch's OpenMP threads may still
            # spin after its call, which would always fall on the same successor.
            for name in names[rep % 3:] + names[:rep % 3]:
                if name != "torch":
                    router.mlxgraph_router_tile(2 if name == "tile" else 0)
                t = time.perf_counter()
                if name == "torch":
                    torch.nn.functional.linear(tx, tw)
                else:
                    mx.eval(x @ w.T)
                times[name].append(time.perf_counter() - t)
                time.sleep(0.002)   # every engine's spinning threads go idle before the next
        before = (ctypes.c_long * 5)()
        router.mlxgraph_router_tile(1)
        router.mlxgraph_router_counts(before, 5)
        mx.eval(x @ w.T)
        after = (ctypes.c_long * 5)()
        router.mlxgraph_router_counts(after, 5)
        out["times"][f"{m}x{k}x{n}"] = dict(times, picks_tile=after[4] > before[4])
    print("RESULT " + json.dumps(out))
""")


def _child(code: str, env: dict, *args) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"benchmark child failed: {proc.stderr[-1500:]}")


def _median(values: list) -> float:
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def measure(repeats: int, threads: list) -> dict:
    """{threads: {"blas": str, "shapes": {shape: {tile/sgemm/torch: [best, median] s}}}}."""
    doc = {}
    for t in threads:
        env = dict(os.environ, MLXGRAPH_BLAS_THREADS=str(t))
        env.pop("MLXGRAPH_BLAS_TILE", None)
        print(f"  {t} thread(s) ...", file=sys.stderr, flush=True)
        got = _child(_CHILD, env, json.dumps(SHAPES), repeats, t)
        if "error" in got:
            doc[str(t)] = got
            continue
        rows = {}
        for key, times in got["times"].items():
            rows[key] = {name: [min(times[name]), _median(times[name])]
                         for name in ("tile", "sgemm", "torch")}
            rows[key]["picks_tile"] = times["picks_tile"]
        doc[str(t)] = {"blas": got["blas"], "shapes": rows}
    return doc


def print_report(doc: dict) -> None:
    """The load average, then one table per thread count (from the --json document)."""
    print(f"load average {doc['load_average'][0]:.1f}")
    for t, part in doc["threads"].items():
        if "error" in part:
            print(f"\n{t} thread(s): {part['error']} ({part['blas']})")
            continue
        print(f"\n{t} thread(s); {part['blas']}")
        print("  product (MxKxN)     tile ms best/median   sgemm ms best/median   sgemm/tile "
              "best median   torch ms best   torch/tile   router picks")
        for key, row in part["shapes"].items():
            tile, sg, tr = row["tile"], row["sgemm"], row["torch"]
            print(f"  {key:18s} {tile[0] * 1e3:9.3f} / {tile[1] * 1e3:8.3f}   "
                  f"{sg[0] * 1e3:9.3f} / {sg[1] * 1e3:8.3f}   {sg[0] / tile[0]:6.2f} "
                  f"{sg[1] / tile[1]:6.2f}   {tr[0] * 1e3:12.3f}   {tr[0] / tile[0]:10.2f}   "
                  f"{'tile' if row['picks_tile'] else 'sgemm'}")


def main() -> int:
    """Run, print the tables (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    doc = {"load_average": os.getloadavg(),
           "threads": measure(args.repeats, [int(t) for t in args.threads.split(",")])}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
