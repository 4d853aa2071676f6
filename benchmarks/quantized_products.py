"""Part 1 of benchmarks/quantized_bench.py, run in its own process: the one-row product
(W 1024 x 2816) as float32 through the BLAS, ``mx.quantized_matmul`` and the native kernel
at q8 and q4 on 1 and 2 threads, and the small model's prefill products the old way
(whole weight dequantized, then the matmul) against the tiled product."""

import time

W_ROWS, COLS, GROUP = 1024, 2816, 64


def _best_ms(fn, mx, repeats=5, inner=20) -> float:
    mx.eval(fn())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            mx.eval(fn())
        best = min(best, (time.perf_counter() - t0) / inner)
    return best * 1e3


# The small model's prefill products (N, K): q/o, k/v, gate/up and down projections.
PREFILL_SHAPES = [(1024, 1024), (256, 1024), (2816, 1024), (1024, 2816)]


def _median_ms_in_turns(fns: dict, mx, repeats=15, inner=3) -> dict:
    """Median ms of each of ``fns`` (name -> fn returning an array), called in turns so a
    drift of the machine's speed falls on all of them alike."""
    times = {name: [] for name in fns}
    names = list(fns)
    for name in names:
        mx.eval(fns[name]())
    for rep in range(repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            t0 = time.perf_counter()
            for _ in range(inner):
                mx.eval(fns[name]())
            times[name].append((time.perf_counter() - t0) / inner * 1e3)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def _old_and_tiled(native, x, q, s, b, bits: int) -> dict:
    """x @ W.T both ways: the whole weight dequantized then the matmul, and tiled."""
    return {"old": lambda: x @ native.dequantize_fn(q, s, b, GROUP, bits).T,
            "tiled": lambda: native.tile_fn(x, q, s, b, GROUP, bits)}


def prefill_products(mx, native, rows: int) -> list:
    """The old prefill path (whole weight dequantized, then the matmul) against the tiled
    product, per small-model shape and bit width; [] without the tiled product."""
    if native.tile_fn is None:
        return []
    out = []
    x_all = mx.random.normal((rows, max(k for _, k in PREFILL_SHAPES)), key=mx.random.key(2))
    for n, k in PREFILL_SHAPES:
        w = mx.random.normal((n, k), key=mx.random.key(3)) * 0.02
        x = x_all[:, :k] + 0
        for bits in (8, 4):
            q, s, b = mx.quantize(w, group_size=GROUP, bits=bits)
            s, b = s.astype(mx.float16), b.astype(mx.float16)
            mx.eval(x, q, s, b)
            ms = _median_ms_in_turns(_old_and_tiled(native, x, q, s, b, bits), mx)
            out.append({"shape": f"{rows}x{k}x{n}", "bits": bits, **ms})
    return out


def matvec_worker(prompt: int) -> dict:
    """Child process: the products of part 1."""
    from mlxgraph.interpreter.native.blas import preload_blas

    preload_blas()
    import mlx.core as mx

    from mlxgraph.interpreter.native.quantized import native_kernel

    native = native_kernel()
    w = mx.random.normal((W_ROWS, COLS), key=mx.random.key(0)) * 0.02
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
        import mlxgraph.interpreter.native._quantized_matvec as ext

        for threads in (1, 2):
            ext.set_threads(threads)
            rows[f"q{bits} native, {threads} thread(s)"] = _best_ms(
                lambda q=q, s=s, b=b, bits=bits: native.fn(x, q, s, b, GROUP, bits), mx)
    if native.fn is not None:
        ext.set_threads(native.threads)   # the prefill products run as a graph's would
    return {"native": native.describe(), "ms": rows,
            "prefill": prefill_products(mx, native, prompt)}
