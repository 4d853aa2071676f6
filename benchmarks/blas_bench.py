"""MLX's matrix products under each BLAS setup: which library, router on/off, the thread
policy (auto, 1 or 2 threads), and float32 against float16/bfloat16.

    python benchmarks/blas_bench.py [--repeats 7] [--json]

Each setup runs in its own process (a preload is global to a process and only counts
before mlx is imported): the package index's OpenBLAS (scipy-openblas32) and, when
installed, Debian's (libopenblas0-pthread, `make blas`), each with the router on (threads
auto, 1, 2) and off (1, 2). Shapes are the generate benchmark's `small` model: decode
products (one row against 1024x1024, 1024x2816 and the 1024x32000 LM head) and a
128-token prefill's. Printed: the best time of each product per setup, GB/s for the
one-row products (weight bytes / time), and each setup's decode and prefill time relative
to the default setup. Setups take turns, twice, so a busy spell on the shared machine does
not fall on one only. This process imports neither mlx nor torch.
"""

import argparse
import json
import os
import subprocess
import sys
import textwrap

DECODE = [(1, 1024, 1024), (1, 1024, 2816), (1, 2816, 1024), (1, 1024, 32000)]  # (M, K, N)
PREFILL = [(128, 1024, 1024), (128, 1024, 2816), (128, 2816, 1024), (128, 1024, 32000)]

_CHILD = textwrap.dedent("""
    import json, sys, time
    import mlxgraph
    info = mlxgraph.preload_blas()
    import mlx.core as mx
    shapes, dtypes, repeats = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    out = {"blas": info.describe(), "times": {}}
    for dt in dtypes:
        for m, k, n in shapes:
            dtype = getattr(mx, dt)
            w = mx.random.normal((n, k)).astype(dtype)   # a Linear weight, used as x @ w.T
            x = mx.random.normal((m, k)).astype(dtype)
            mx.eval(w, x, x @ w.T)
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                mx.eval(x @ w.T)
                best = min(best, time.perf_counter() - t)
            out["times"][f"{dt} {m}x{k}x{n}"] = best
    print("RESULT " + json.dumps(out))
""")


def setups() -> list:
    """(name, environment overrides), the default first."""
    libs = [("pypi", "scipy-openblas32")]
    probe = subprocess.run(
        [sys.executable, "-c", "import ctypes; ctypes.CDLL('libopenblas.so.0')"],
        capture_output=True,
    )
    if probe.returncode == 0:
        libs.append(("debian", "libopenblas.so.0"))
    out = []
    for lib, value in libs:
        for router in ("1", "0"):
            for threads in ("auto", "1", "2") if router == "1" else ("1", "2"):
                name = f"{lib} router {'on' if router == '1' else 'off'} {threads}t"
                out.append(
                    (
                        name,
                        {
                            "MLXGRAPH_BLAS": value,
                            "MLXGRAPH_BLAS_ROUTER": router,
                            "MLXGRAPH_BLAS_THREADS": threads,
                        },
                    )
                )
    out.append(("bundled reference", {"MLXGRAPH_BLAS": "none"}))
    return out


def run_setup(env_extra: dict, shapes, dtypes, repeats: int) -> dict:
    """Time each (M, K, N) product (x @ w.T) in a fresh process with ``env_extra`` set."""
    env = dict(os.environ, **env_extra)
    env.pop("OPENBLAS_NUM_THREADS", None)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(shapes), json.dumps(dtypes), str(repeats)],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise SystemExit(f"blas_bench: {env_extra} failed:\n{proc.stderr[-2000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def _merge(old, new):
    if old is None:
        return new
    return {
        "blas": new["blas"],
        "times": {k: min(v, old["times"][k]) for k, v in new["times"].items()},
    }


def main(argv=None) -> int:
    """Run every setup; print the table (or --json)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = {}
    shapes = [list(s) for s in DECODE + PREFILL]
    for _ in range(args.rounds):
        for name, env in setups():
            # The bundled reference BLAS is slow: decode shapes only, fewer repeats.
            bundled = name.startswith("bundled")
            r = run_setup(
                env,
                [list(s) for s in DECODE] if bundled else shapes,
                ["float32"],
                2 if bundled else args.repeats,
            )
            results[name] = _merge(results.get(name), r)
    half = run_setup({}, [list(DECODE[1]), list(PREFILL[1])], ["float32", "bfloat16", "float16"], 3)
    doc = {
        "benchmark": "blas",
        "setups": results,
        "half_precision": half,
        "load_average": os.getloadavg(),
    }
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print_report(doc)
    return 0


def _sum(times, shapes) -> float:
    return sum(times.get(f"float32 {m}x{k}x{n}", float("nan")) for m, k, n in shapes)


def print_report(doc) -> None:
    """The human-readable table."""
    setups_ = doc["setups"]
    base = next(iter(setups_.values()))["times"]
    print(
        "\nBLAS bench: MLX float32 products, best of runs (ms); "
        f"load average {doc['load_average'][0]:.1f}"
    )
    cols = [f"{m}x{k}x{n}" for m, k, n in DECODE + PREFILL]
    print(f"  {'setup':<22}" + "".join(f"{c:>15}" for c in cols) + f"{'decode':>9}{'prefill':>9}")
    for name, r in setups_.items():
        t = r["times"]
        cells = "".join(
            f"{t[f'float32 {c}'] * 1e3:>15.2f}" if f"float32 {c}" in t else f"{'-':>15}"
            for c in cols
        )
        dec = _sum(t, DECODE) / _sum(base, DECODE)
        pre = _sum(t, PREFILL) / _sum(base, PREFILL)
        print(f"  {name:<22}{cells}{dec:>8.2f}x{pre:>8.2f}x")
    print(
        "  (decode / prefill: the summed time of those products relative to the first setup; "
        "lower is faster)"
    )
    print("  one-row products, GB/s of weights read:")
    for name, r in setups_.items():
        t = r["times"]
        rates = "  ".join(
            f"{m}x{k}x{n} {k * n * 4 / t[f'float32 {m}x{k}x{n}'] / 1e9:5.1f}" for m, k, n in DECODE
        )
        print(f"    {name:<22}{rates}")
    h = doc["half_precision"]
    print(f"half precision ({h['blas']}):")
    for m, k, n in (DECODE[1], PREFILL[1]):
        f32 = h["times"][f"float32 {m}x{k}x{n}"]
        row = "  ".join(
            f"{dt} {(t := h['times'][f'{dt} {m}x{k}x{n}']) * 1e3:7.2f} ms ({t / f32:4.1f}x)"
            for dt in ("float32", "bfloat16", "float16")
        )
        print(f"    {m}x{k}x{n}: {row}")


if __name__ == "__main__":
    sys.exit(main())
