"""float32 decode's products against the memory bound: the router's one-row kernel
(interpreter/native/matvec_f32.c) against the BLAS's sgemv, and greedy agreement.

    python benchmarks/matvec_bench.py [--rounds 5] [--models tiny-code,small] [--tokens 128]
        [--workdir DIR] [--json]

Part 1, one process: the one-row products of a decode step of the small Llama (8 layers
of q, k, v, o, gate, up and down, then the 1024 x 32000 LM head: 472 MiB of distinct
float32 weights, more than a core's caches, so every step streams them from memory as
a decode does) through MLX's ``x @ W.T``, the router's one-row kernel and the BLAS's
sgemv taking turns (``--rounds``), each at one thread and at the default policy (every
core from 1M multiply-adds). Printed: best ms per step and for the head alone, GB/s of
weights read, and that as a fraction of the machine's all-core read bandwidth
(benchmarks/machine.py, measured in the same run) with the load average.

Part 2, per ``--models`` entry (float32 graphs of tiny-code and of quantized_bench's small
Llama, exported into ``--workdir`` and reused): ``--tokens`` greedy tokens after a fixed
16-token prompt with the kernel on and off (``MLXGRAPH_BLAS_MATVEC``, each in its own
process): how many agree before the first difference, and decode tok/s of each.
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import describe, load_average, machine_facts, measure_bandwidth

# (N, K) of the small Llama's Linear weights per layer, and its LM head.
LAYER = [(1024, 1024), (256, 1024), (256, 1024), (1024, 1024), (2816, 1024), (2816, 1024),
         (1024, 2816)]
LAYERS, HEAD = 8, (32000, 1024)
ENGINE = Path(__file__).resolve().parent / "engines" / "mlxgraph_engine.py"


def measure_products(rounds: int) -> dict:
    """Part 1: {setup: {"step_ms", "head_ms"}}, best over rounds, plus the bytes read."""
    from mlxgraph.interpreter.native.blas import preload_blas

    info = preload_blas()
    import mlx.core as mx

    if not info.router_path:
        raise SystemExit(f"matvec_bench: no BLAS router here ({info.router})")
    router = ctypes.CDLL(info.router_path)
    router.mlxgraph_router_threads.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long)
    cpus = min(len(os.sched_getaffinity(0)), 8)
    mx.random.seed(0)
    shapes = LAYER * LAYERS + [HEAD]
    weights = [mx.random.normal(s) * 0.02 for s in shapes]
    xs = {k: mx.random.normal((1, k)) for k in {s[1] for s in shapes}}
    mx.eval(weights, xs)
    setups = {f"{kernel} {name}": (kernel == "matvec", threads)
              for kernel in ("matvec", "sgemv") for name, threads in
              (("1 thread", 1), (f"{cpus} threads from 1M", cpus))}
    best = {name: {"step_ms": float("inf"), "head_ms": float("inf")} for name in setups}
    for _ in range(rounds):
        for name, (native, threads) in setups.items():
            router.mlxgraph_router_matvec(int(native))
            router.mlxgraph_router_threads(1, threads, 1 << 20)
            t0 = time.perf_counter()
            for w in weights[:-1]:
                mx.eval(xs[w.shape[1]] @ w.T)
            t1 = time.perf_counter()
            mx.eval(xs[HEAD[1]] @ weights[-1].T)
            t2 = time.perf_counter()
            got = best[name]
            got["step_ms"] = min(got["step_ms"], (t2 - t0) * 1e3)
            got["head_ms"] = min(got["head_ms"], (t2 - t1) * 1e3)
    return {"setups": best, "step_bytes": sum(4 * n * k for n, k in shapes),
            "head_bytes": 4 * HEAD[0] * HEAD[1]}


def float32_graph(name: str, workdir: Path, tokens: int) -> str:
    """The float32 graph of ``name`` (quantized_bench's folders), exported once."""
    from quantized_bench import model_folder

    from mlxgraph.exporter import export

    graph = workdir / f"{name}-float32-{tokens + 24}.mlxg"
    if not graph.is_file():
        export(str(model_folder(name, workdir)), graph, max_seq_len=tokens + 24)
    return str(graph)


def greedy(graph: str, tokens: int) -> dict:
    """Part 2 for one graph: tokens and decode tok/s with the kernel on and off."""
    runs = {}
    for switch in ("on", "off"):
        env = {**os.environ, "MLXGRAPH_BLAS_MATVEC": switch}
        cmd = [sys.executable, str(ENGINE), "--model", graph, "--prompt-ids",
               ",".join(str(3 + 7 * i) for i in range(16)), "--new-tokens", str(tokens),
               "--runs", "1"]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
        runs[switch] = json.loads(line[len("RESULT "):])
    a, b = runs["on"]["tokens"], runs["off"]["tokens"]
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {"graph": Path(graph).name, "tokens": len(a), "agree_before_first_difference": same,
            "decode_tps_on": runs["on"]["decode_tps"], "decode_tps_off": runs["off"]["decode_tps"]}


def print_report(doc) -> None:
    """The tables."""
    print(f"matvec bench: the small Llama's one-row products, {doc['step_bytes'] / 2**20:.0f} "
          "MiB of weights per step, MLX x @ W.T through the router, best of turns")
    print("machine: " + describe(doc["machine"], doc["bandwidth"]))
    bound = doc["bandwidth"]["bound"]
    print(f"  {'setup':<28} {'step ms':>8} {'GB/s':>6} {'of bound':>8} {'head ms':>8} "
          f"{'GB/s':>6}")
    for name, got in doc["setups"].items():
        step = doc["step_bytes"] / got["step_ms"] / 1e6
        head = doc["head_bytes"] / got["head_ms"] / 1e6
        print(f"  {name:<28} {got['step_ms']:8.2f} {step:6.1f} {step * 1e9 / bound:7.0%} "
              f"{got['head_ms']:8.2f} {head:6.1f}")
    for g in doc.get("greedy", []):
        print(f"  {g['graph']}: {g['agree_before_first_difference']}/{g['tokens']} greedy "
              f"tokens agree (matvec kernel on vs sgemv); decode {g['decode_tps_on']:.1f} vs "
              f"{g['decode_tps_off']:.1f} tok/s")


def main(argv=None) -> int:
    """Both parts; the report (or --json)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", default="tiny-code,small", help="part 2's models ('' skips)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--workdir", help="keep (and reuse) folders and graphs here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    facts = machine_facts()
    doc = {"machine": facts, "bandwidth": measure_bandwidth(), **measure_products(args.rounds)}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        doc["greedy"] = [greedy(float32_graph(m, workdir, args.tokens), args.tokens)
                         for m in args.models.split(",") if m]
    facts["load_end"] = load_average()
    print(json.dumps(doc) if args.json else "", end="\n" if args.json else "")
    if not args.json:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
