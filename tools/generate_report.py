"""What `mlxgraph generate` reports after the text: the stats document (--json) and the
stats lines on stderr (tokens, tok/s, peak memory, BLAS, prompt cache, window notes)."""

from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.tools.output import human_bytes, peak_rss_bytes


def stats_doc(stats, blas, sampler, mx) -> dict:
    """The JSON-ready sampling settings and stats of one generation."""
    return {
        "sampling": sampler.describe(),
        "stats": {
            "prompt_tokens": stats.prompt_tokens,
            "generated_tokens": stats.generated_tokens,
            "prefill_seconds": stats.prefill_seconds,
            "decode_seconds": stats.decode_seconds,
            "prefill_tokens_per_second": stats.prefill_tps,
            "decode_tokens_per_second": stats.decode_tps,
            "peak_memory_bytes": int(mx.get_peak_memory()),
            "peak_rss_bytes": peak_rss_bytes(),
            "blas": blas.as_dict(),
        },
    }


def _is_linear(op: str, quantized: bool) -> bool:
    """Whether ``op`` is a Linear (x @ W.T), quantized or float as asked."""
    op = entry(op)
    return op.has(Trait.ROW_WISE) and op.has(Trait.QUANTIZED) == quantized


def quantized_stats(program) -> dict | None:
    """Which kernel the graph's QuantizedLinear nodes run on (None for a graph without any)."""
    if not any(_is_linear(n.record.op, quantized=True) for n in program.nodes):
        return None
    from mlxgraph.interpreter.native.quantized import native_kernel

    return native_kernel().as_dict(int8=program.int8_activations)


def half_matvec_stats(program) -> dict | None:
    """Which kernel the graph's float16/bfloat16 Linear nodes run on at decode (None for a
    graph without any)."""
    from mlxgraph.interpreter.mlx_dtypes import HALF_DTYPES
    from mlxgraph.interpreter.native.quantized import native_kernel

    if not any(_is_linear(n.record.op, quantized=False)
               and program.tensor_dtypes[n.record.fields["weight"]] in HALF_DTYPES
               for n in program.nodes):
        return None
    kernel = native_kernel()
    return {"native": kernel.half_fn is not None, "kernel": kernel.describe_half()}


def native_ops_stats() -> dict:
    """Whether float32 sigmoid/SiLU, attention softmax, RMSNorm, RoPE run on native kernels."""
    from mlxgraph.interpreter.native import activations as native_activations

    return {"native": native_activations.native_module() is not None,
            "kernel": native_activations.describe()}


def print_stats(stats, doc, blas, err) -> None:
    """The stats lines for a person (stderr)."""
    s = doc["stats"]
    seed = doc["sampling"]["seed"]
    mode = "greedy" if seed is None else f"sampled, seed {seed}"
    print("-" * 60, file=err)
    print(
        f"prompt     {stats.prompt_tokens:6d} tokens   prefill {stats.prefill_tps:9.1f} tok/s",
        file=err,
    )
    print(
        f"generated  {stats.generated_tokens:6d} tokens   decode  {stats.decode_tps:9.1f} tok/s"
        f"   ({mode}; stopped: {stats.stop_reason.replace('_', ' ')})",
        file=err,
    )
    print(
        f"peak memory  {human_bytes(s['peak_memory_bytes'])} MLX, "
        f"{human_bytes(s['peak_rss_bytes'])} process RSS",
        file=err,
    )
    kv = doc.get("kv_cache")
    if kv:
        print(f"context      {kv['capacity']} tokens of KV capacity ({kv['capacity_reason']})",
              file=err)
    if s.get("device"):
        print(f"device       {s['device']['mlx']}, {s['device']['plan']} plan", file=err)
    print(f"BLAS         {blas.describe()}", file=err)
    if s.get("quantized"):
        print(f"quantized    {s['quantized']['kernel']}", file=err)
    if s.get("half_matvec"):
        print(f"half matvec  {s['half_matvec']['kernel']}", file=err)
    if s.get("native_ops"):
        print(f"native ops   {s['native_ops']['kernel']}", file=err)
    print_compute_note(s["compute"], err)


def print_cache_notes(doc, err) -> None:
    """The prompt cache's reuse and any window approximation, one line each."""
    pc = doc["prompt_cache"]
    if pc:
        note = f" ({pc['note']})" if pc["note"] else ""
        print(
            f"prompt cache {pc['reused_tokens']} tokens reused, {pc['saved_tokens']} saved "
            f"to {pc['path']}{note}",
            file=err,
        )
    for line in approximation_lines(doc["kv_cache"]["approximations"]):
        print(line, file=err)


def approximation_lines(approximations: dict) -> list:
    """One line per window of a session's ``approximations`` ({layer_id: window}, --window);
    none when the session computes the model as it is."""
    by_window = {}
    for lid, w in approximations.items():
        by_window.setdefault(w, []).append(str(lid))
    return [f"approximation: full-attention layers {','.join(lids)} keep only the last "
            f"{w} tokens (--window)" for w, lids in by_window.items()]


def print_compute_note(compute: dict, err) -> None:
    """Print generate's compute line when the note says something."""
    note = compute_note(compute)
    if note:
        print(f"compute      {note}", file=err)


def compute_note(compute: dict) -> str:
    """generate's line on the dtypes computed in, for a half-precision graph ('' otherwise)."""
    dtypes = ", ".join(compute["dtypes"])
    if compute["widened_from"]:
        widened = ", ".join(compute["widened_from"])
        return f"{dtypes} (widened from {widened} at load: --compute-dtype)"
    if {"float16", "bfloat16"} & set(compute["dtypes"]):
        return (f"{dtypes}: MLX's half-precision matmuls on CPU are 20-50x slower than float32 "
                "(decode-sized Linear steps take the native half kernel, if built); "
                "--compute-dtype float32 widens at load")
    return ""


__all__ = [
    "approximation_lines",
    "compute_note",
    "print_cache_notes",
    "print_compute_note",
    "print_stats",
    "stats_doc",
]
