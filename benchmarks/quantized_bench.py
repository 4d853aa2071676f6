"""Quantized weights on the CPU: matrix-vector kernels; float32, q8 and q4 graphs side by side.

    python benchmarks/quantized_bench.py [--model tiny-code] [--prompt 128] [--decode 64] [--json]

Part 1, the issue's product (W 1024 x 2816, one row of x): float32 through the preloaded
BLAS (the router's sgemv), MLX's ``mx.quantized_matmul`` and mlxgraph's native kernel at
q8 and q4 (group 64; 1 and 2 threads); best-of-5 ms per product and each one's ratio to
float32.

Part 2, the model exported as float32, q8 and q4 (group 64): file size (and its ratio to
float32), prefill tok/s of a ``--prompt``-token prompt and greedy decode tok/s over
``--decode`` steps, for the quantized graphs once with the native kernel and once with
MLX's op (``MLXGRAPH_QUANTIZED_KERNEL=mlx``); every run in its own process with the BLAS
preloaded. "tokens equal" says whether the native kernel's greedy tokens equal those of
the same graph on MLX's own op (the dequantized reference). llama.cpp is not measured here.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS, COLS, GROUP = 1024, 2816, 64


def _best_ms(fn, mx, repeats=5, inner=20) -> float:
    mx.eval(fn())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            mx.eval(fn())
        best = min(best, (time.perf_counter() - t0) / inner)
    return best * 1e3


def matvec_worker() -> dict:
    """Child process: the products of part 1."""
    from mlxgraph.interpreter.blas import preload_blas

    preload_blas()
    import mlx.core as mx

    from mlxgraph.interpreter.quantized_native import native_kernel

    native = native_kernel()
    w = mx.random.normal((ROWS, COLS), key=mx.random.key(0)) * 0.02
    x = mx.random.normal((1, COLS), key=mx.random.key(1))
    mx.eval(w, x)
    rows = {"float32 (BLAS)": _best_ms(lambda: x @ w.T, mx)}
    for bits in (8, 4):
        q, s, b = mx.quantize(w, group_size=GROUP, bits=bits)
        mx.eval(q, s, b)
        rows[f"q{bits} mx.quantized_matmul"] = _best_ms(
            lambda q=q, s=s, b=b, bits=bits: mx.quantized_matmul(
                x, q, s, b, transpose=True, group_size=GROUP, bits=bits), mx)
        if native.fn is None:
            continue
        import mlxgraph.interpreter._quantized_matvec as ext

        for threads in (1, 2):
            ext.set_threads(threads)
            rows[f"q{bits} native, {threads} thread(s)"] = _best_ms(
                lambda q=q, s=s, b=b, bits=bits: native.fn(x, q, s, b, GROUP, bits), mx)
    return {"native": native.describe(), "ms": rows}


def model_worker(graph: str, prompt: int, decode: int) -> dict:
    """Child process: prefill and greedy decode of one graph."""
    from mlxgraph.interpreter.blas import preload_blas

    preload_blas()
    import mlx.core as mx
    import numpy as np

    import mlxgraph

    program = mlxgraph.load(graph)
    ids = np.random.default_rng(0).integers(3, program.metadata.vocab_size, prompt)
    session = program.session(capacity=prompt + decode + 1)
    t0 = time.perf_counter()
    logits = session.step(ids[None].astype(np.int32), range(prompt))
    token = int(mx.argmax(logits[0, -1]).item())
    prefill = time.perf_counter() - t0
    tokens, t0 = [token], time.perf_counter()
    for i in range(decode):
        logits = session.step(np.array([[tokens[-1]]], np.int32), [prompt + i])
        tokens.append(int(mx.argmax(logits[0, -1]).item()))
    return {"prefill_tps": prompt / prefill, "decode_tps": decode / (time.perf_counter() - t0),
            "tokens": tokens, "peak_memory_bytes": int(mx.get_peak_memory())}


def _child(args: list, env=None) -> dict:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                          check=True, env={**os.environ, **(env or {})})
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args) -> dict:
    """Both parts; the graphs are exported into a temporary folder."""
    from mlxgraph.exporter import export
    from mlxgraph.exporter.quantize import QuantizeRecipe

    doc = {"matvec": _child(["--matvec-worker"]), "model": args.model, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        sizes = {}
        for mode in ("float32", "q8", "q4"):
            path = Path(tmp) / f"{mode}.mlxg"
            recipe = None if mode == "float32" else QuantizeRecipe(mode, GROUP)
            sizes[mode] = export(args.model, path, quantize=recipe)["file_bytes"]
            kernels = ["-"] if recipe is None else ["native", "mlx"]
            for kernel in kernels:
                env = {"MLXGRAPH_QUANTIZED_KERNEL": kernel} if kernel == "mlx" else {}
                run = _child(["--model-worker", str(path), str(args.prompt), str(args.decode)], env)
                doc["runs"].append({"graph": mode, "kernel": kernel, "file_bytes": sizes[mode],
                                    "size_ratio": sizes[mode] / sizes["float32"], **run})
    by = {(r["graph"], r["kernel"]): r for r in doc["runs"]}
    for r in doc["runs"]:
        r["decode_ratio_to_float32"] = r["decode_tps"] / by[("float32", "-")]["decode_tps"]
        if r["kernel"] == "native":
            r["tokens_equal_mlx_op"] = r["tokens"] == by[(r["graph"], "mlx")]["tokens"]
    return doc


def print_table(doc: dict) -> None:
    """Both parts as tables."""
    m = doc["matvec"]
    print(f"W {ROWS} x {COLS}, one row, group {GROUP}; quantized kernel: {m['native']}")
    f32 = m["ms"]["float32 (BLAS)"]
    for name, ms in m["ms"].items():
        print(f"  {name:32s} {ms:8.3f} ms   {f32 / ms:5.2f}x float32")
    print(f"\n{doc['model']}: prefill and greedy decode (tokens equal: native vs MLX's op)")
    print(f"{'graph':8s} {'kernel':7s} {'file':>10s} {'size':>6s} {'prefill':>9s} {'decode':>9s} "
          f"{'vs f32':>7s} {'tokens equal':>12s}")
    for r in doc["runs"]:
        same = {True: "yes", False: "NO", None: "-"}[r.get("tokens_equal_mlx_op")]
        print(f"{r['graph']:8s} {r['kernel']:7s} {r['file_bytes'] / 2**20:8.1f}MB "
              f"{r['size_ratio']:6.3f} {r['prefill_tps']:9.0f} {r['decode_tps']:9.1f} "
              f"{r['decode_ratio_to_float32']:6.2f}x {same:>12s}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-code", help="a built-in name or model folder")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--matvec-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.matvec_worker:
        print(json.dumps(matvec_worker()))
        return 0
    if args.model_worker:
        graph, prompt, decode = args.model_worker
        print(json.dumps(model_worker(graph, int(prompt), int(decode))))
        return 0
    doc = measure(args)
    print(json.dumps(doc, indent=1) if args.json else "", end="")
    if not args.json:
        print_table(doc)
    same = [r["tokens_equal_mlx_op"] for r in doc["runs"] if "tokens_equal_mlx_op" in r]
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
