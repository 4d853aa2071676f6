"""The native float32 RMSNorm and RoPE (interpreter/native/norm_rope.cpp) against the MLX-op
code they replace (interpreter/kernels/fused.py with the native kernels patched out).

    python benchmarks/norm_rope_bench.py [--repeats 300] [--steps 30] [--processes 10]
                                         [--graph small.mlxg] [--json]

1. Each op alone, the benchmark's `small` Llama's shapes (hidden 1024; 16 query and 4 K/V
   heads of 64; cos/sin [1, 1, T, 64], q and k the transposed views the graph passes), for
   a 128-token prefill and a 1-token decode step: native and MLX ops called in turns in ONE
   process (this VM has slow and fast spells of seconds), best and median ms.
2. The small model's 128-token prefill step, native RMSNorm/RoPE on and off in turns in ONE
   process (only these two differ), best and median ms.
3. The same step in separate processes alternating MLXGRAPH_NATIVE_ACTIVATIONS=1/0 (which
   also switches the native SiLU and attention softmax), best and median per process.
The graph is out/bench/small.mlxg (built as benchmarks/generate_bench.py builds it) or --graph.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from generate_bench import ROOT, prepare

PROMPT = 128


def _stats(times) -> dict:
    return {"min_ms": 1e3 * min(times), "median_ms": 1e3 * float(np.median(times))}


@contextmanager
def _mlx_ops(native_activations):
    """The fused kernels without the native RMSNorm and RoPE (their MLX-op code)."""
    saved = native_activations.rms_norm, native_activations.rope
    native_activations.rms_norm = native_activations.rope = lambda *a: None
    try:
        yield
    finally:
        native_activations.rms_norm, native_activations.rope = saved


def _interleaved(cases: dict, repeats: int, native_activations) -> dict:
    """{name: {"native": stats, "mlx": stats}} of fn() evaluated in turns."""
    import mlx.core as mx

    out = {}
    for name, fn in cases.items():
        times = {"native": [], "mlx": []}
        for _ in range(repeats):
            for kind in times:
                with _mlx_ops(native_activations) if kind == "mlx" else _nothing():
                    t = time.perf_counter()
                    mx.eval(fn())
                    times[kind].append(time.perf_counter() - t)
        out[name] = {k: _stats(v) for k, v in times.items()}
    return out


@contextmanager
def _nothing():
    yield


def op_cases() -> dict:
    import mlx.core as mx

    from mlxgraph.interpreter.kernels.fused import rms_norm, rope

    rng = np.random.default_rng(0)
    cases = {}
    for t in (PROMPT, 1):
        x = mx.array(rng.standard_normal((1, t, 1024), dtype=np.float32))
        w = mx.array(rng.standard_normal(1024, dtype=np.float32))
        cos, sin = (mx.array(rng.standard_normal((1, 1, t, 64), dtype=np.float32))
                    for _ in range(2))
        q = mx.swapaxes(mx.array(rng.standard_normal((1, t, 16, 64), dtype=np.float32)), 1, 2)
        k = mx.swapaxes(mx.array(rng.standard_normal((1, t, 4, 64), dtype=np.float32)), 1, 2)
        mx.eval(x, w, cos, sin, q, k)
        cases[f"RmsNorm [1,{t},1024]"] = lambda x=x, w=w: rms_norm(x, w, 1e-6)
        cases[f"Rope q [1,16,{t},64]"] = lambda q=q, c=cos, s=sin: rope(q, c, s)
        cases[f"Rope k [1,4,{t},64]"] = lambda k=k, c=cos, s=sin: rope(k, c, s)
    return cases


def prefill_fn(graph: Path):
    import mlx.core as mx

    import mlxgraph

    program = mlxgraph.load(graph)
    tokens = mx.array(np.arange(1, PROMPT + 1, dtype=np.int32)[None])

    def step():
        return program.session().step(tokens, mx.arange(PROMPT))
    return step


_CHILD = """
import sys, time, mlxgraph, numpy as np
mlxgraph.preload_blas()
import mlx.core as mx
program, n = mlxgraph.load(sys.argv[1]), int(sys.argv[3])
tokens = mx.array(np.arange(1, n + 1, dtype=np.int32)[None])
times = []
for _ in range(int(sys.argv[2]) + 2):
    s = program.session()
    t = time.perf_counter()
    mx.eval(s.step(tokens, mx.arange(n)))
    times.append(time.perf_counter() - t)
print(min(times[2:]))
"""


def processes(graph: Path, rounds: int, steps: int) -> dict:
    """Best step of each process, processes alternating the switch on and off."""
    best = {"on": [], "off": []}
    for _ in range(rounds):
        for kind in best:
            env = dict(os.environ, MLXGRAPH_NATIVE_ACTIVATIONS="1" if kind == "on" else "0")
            cmd = [sys.executable, "-c", _CHILD, str(graph), str(steps), str(PROMPT)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            best[kind].append(float(out.stdout.split()[-1]))
    return {k: _stats(v) for k, v in best.items()}


def print_report(doc) -> None:
    """The table (from the --json document)."""
    print(doc["kernel"])
    print(f"{'op':24s} {'native min/med ms':>18s} {'MLX ops min/med ms':>19s} "
          f"{'MLX/native min/med':>19s}")
    rows = {**doc["ops"], f"prefill {PROMPT} (in turns)": doc["prefill_in_turns"]}
    for name, r in rows.items():
        n, m = r["native"], r["mlx"]
        print(f"{name:24s} {n['min_ms']:8.3f} /{n['median_ms']:8.3f} "
              f"{m['min_ms']:9.3f} /{m['median_ms']:8.3f} "
              f"{m['min_ms'] / n['min_ms']:9.2f}x /{m['median_ms'] / n['median_ms']:6.2f}x")
    p = doc["prefill_processes"]
    print(f"prefill {PROMPT}, processes alternating the switch (all native ops): on "
          f"{p['on']['min_ms']:.1f} / {p['on']['median_ms']:.1f} ms, off "
          f"{p['off']['min_ms']:.1f} / {p['off']['median_ms']:.1f} ms (min / median)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=300, help="turns per op")
    ap.add_argument("--steps", type=int, default=30, help="prefill steps in turns (part 2)")
    ap.add_argument("--processes", type=int, default=10, help="rounds of on/off processes")
    ap.add_argument("--graph", help="the small model's graph (default: out/bench/small.mlxg,"
                    " built if missing)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import mlxgraph

    mlxgraph.preload_blas()
    from mlxgraph.interpreter.native import activations as native_activations

    if native_activations.native_module() is None:
        raise SystemExit("norm_rope_bench: the native kernels are not built (or switched off)")
    graph = Path(args.graph) if args.graph else ROOT / "out" / "bench" / "small.mlxg"
    if not graph.is_file():
        graph.parent.mkdir(parents=True, exist_ok=True)
        prepare("small", graph.parent, lambda m: print(m, file=sys.stderr))
    report = {"kernel": native_activations.describe(),
              "ops": _interleaved(op_cases(), args.repeats, native_activations)}
    step = prefill_fn(graph)
    report["prefill_in_turns"] = _interleaved({f"prefill {PROMPT}": step}, args.steps,
                                              native_activations)[f"prefill {PROMPT}"]
    report["prefill_processes"] = processes(graph, args.processes, 5)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
