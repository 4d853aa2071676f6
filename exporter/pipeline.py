"""export(): a Hugging Face model folder or built-in name to a .mlxg graph file.

Steps (each reported through ``progress``): load the model, torch.export it through the
adapter with a dynamic sequence length, run_decompositions, lower to graph nodes, write.
"""

import time
import warnings
from collections import Counter
from pathlib import Path

import torch

from mlxgraph.exporter.adapter import AdapterError, DecoderAdapter
from mlxgraph.exporter.builtins import BUILD_LOCK
from mlxgraph.exporter.cache_probe import shared_cache_problem
from mlxgraph.exporter.decompositions import decompose_to_core_aten
from mlxgraph.exporter.errors import ExportError, TraceError, UnsupportedModelError
from mlxgraph.exporter.finite_weights import nonfinite_weights
from mlxgraph.exporter.fusions import drop_dead_code, drop_dtype_assertions
from mlxgraph.exporter.lowering_pass import UnsupportedOpsError, lower_program
from mlxgraph.exporter.model_info import (
    DEFAULT_MAX_SEQ_LEN,
    embedding_rows,
    model_info,
    resolve_max_seq_len,
)
from mlxgraph.exporter.model_loading import DTYPES, load_model
from mlxgraph.exporter.model_support import check_model
from mlxgraph.exporter.packed_weights import keep_packed
from mlxgraph.exporter.position_hooks import positions_from_step_length
from mlxgraph.exporter.quantize import QuantizeRecipe, quantize_graph
from mlxgraph.exporter.resident_pages import ResidentPages
from mlxgraph.exporter.state_adapter import unrouted_scan
from mlxgraph.exporter.tokenizer_source import read_tokenizer, tokenizer_source
from mlxgraph.exporter.trace_scope import ModuleScope, torch_reason
from mlxgraph.schema.atomic_write import check_replaceable
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.spec import op_spec
from mlxgraph.schema.writer import GraphWriter

# Graph inputs: int32 because MLX indexes and embeds with int32 natively; int64 would
# buy nothing below 2**31 tokens or positions.
INPUT_DTYPE = torch.int32
# torch.export and run_decompositions keep process-global state (the dispatch mode stack,
# the module hierarchy being traced): two at once in two threads corrupt each other, so
# they take turns, on the same lock as model building (which changes torch's defaults).
# Lowering and writing need no lock (their state is the export's own).
_TORCH_EXPORT_LOCK = BUILD_LOCK


def _no_progress(_message: str) -> None:
    pass


def trace(adapter, max_seq_len: int):
    """torch.export the adapter with a dynamic sequence length T in [1, max_seq_len].

    Raises:
        AdapterError: the model's attention asked for something the graph op cannot do.
        TraceError: torch.export failed: one line naming the module being traced, what
            torch's error means where known and its first informative line.
    """
    # The example has T = 2: torch.export specializes a dimension traced at size 1.
    tokens = torch.zeros((1, 2), dtype=INPUT_DTYPE)
    positions = torch.arange(2, dtype=INPUT_DTYPE)
    seq = torch.export.Dim("T", min=1, max=max_seq_len)
    scope = ModuleScope(adapter.model, prefix="")
    try:
        with torch.no_grad(), scope:
            return torch.export.export(adapter, (tokens, positions),
                                       dynamic_shapes={"tokens": {1: seq}, "positions": {0: seq}})
    except TraceError as e:  # the adapter's (data-dependent code): now say where
        where = scope.failed_in or "the model"
        raise TraceError(f"torch.export failed in {where}: {e.reason}") from e.__cause__
    except AdapterError:
        raise
    except Exception as e:
        where = scope.failed_in or "the model"
        raise TraceError(f"torch.export failed in {where}: {torch_reason(e)}") from e


def decompose(ep):
    """``ep`` decomposed to core ATen (exporter/decompositions.py), without torch's noise
    about its own API. ``ep``'s dtype assertions are dropped first: decomposing them costs
    time and they are dropped after anyway (fusions.drop_dead_code).

    Raises:
        TraceError: a decomposition failed (one line, as trace's).
    """
    drop_dtype_assertions(ep.graph)
    ep.graph_module.recompile()
    with warnings.catch_warnings():
        # torch's own pytree code warns about its own deprecated API while decomposing.
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        try:
            return decompose_to_core_aten(ep)
        except Exception as e:
            raise TraceError(f"run_decompositions failed: {torch_reason(e)}") from e


def _graph(m, max_seq_len: int, step):
    """(adapter, writer, lowering stats): adapt, trace, decompose and lower ``m``."""
    previous = m.config._attn_implementation
    previous_experts = (
        m.get_experts_implementation() if hasattr(m, "get_experts_implementation") else None
    )
    try:
        adapter = DecoderAdapter(m)
        with _TORCH_EXPORT_LOCK:
            ep = step("torch.export", lambda: trace(adapter, max_seq_len))
    finally:
        # A caller's module is left as it was given.
        if previous is not None:
            m.set_attn_implementation(previous)
        if previous_experts is not None and previous_experts != m.get_experts_implementation():
            m.set_experts_implementation(previous_experts)
    if (where := unrouted_scan(m, adapter.states)) is not None:
        raise AdapterError(f"{where}: its scan did not go through mamba2_scan_forward, so it "
                           "would run without its recurrent state")
    # A layer attended again in the forward got a cache of its own: the model's own cache
    # must agree (exporter/cache_probe.py).
    if adapter.reused_layers() and (why := shared_cache_problem(m)) is not None:
        raise AdapterError(f"{type(m).__name__}: {why}")
    if positions_from_step_length(ep):
        raise AdapterError(
            f"{type(m).__name__}: its positions are counted from the step's own length (an "
            "arange over the tokens plus a cache length), not read from the positions given, "
            "so every step after a first prefill would be wrong")
    if not adapter.layer_infos() and not adapter.state_infos():
        raise AdapterError(
            f"{type(m).__name__}: no attention layer called the mlxgraph attention "
            "implementation (the model does not use transformers' AttentionInterface)"
        )
    with _TORCH_EXPORT_LOCK:
        ep = step("decompositions", lambda: decompose(ep))
    drop_dead_code(ep.graph)  # nothing lowered or refused that no output reads (fusions.py)
    writer = GraphWriter(producer=f"mlxgraph exporter (torch {torch.__version__})")
    lowered = step("lowering", lambda: lower_program(ep, writer, output_names=("logits",)))
    return adapter, writer, lowered


def export(
    model,
    out_path,
    dtype: str | None = None,
    max_seq_len: int | None = None,
    progress=None,
    allow_nonfinite: bool = False,
    quantize: QuantizeRecipe | None = None,
    tokenizer=None,
) -> dict:
    """Export a decoder to a graph file.

    Args:
        model: a Hugging Face model folder (config.json + safetensors), a built-in name
            (tiny-code, the trained one; tiny-llama, tiny-qwen2, tiny-mistral, tiny-gemma3,
            tiny-phi3, random), or a ``*ForCausalLM`` module (converted to ``dtype`` and
            eval mode in place).
        out_path: the .mlxg file to write.
        dtype: float32, float16 or bfloat16: the graph's compute and weight dtype; None
            is float32, or an MLX-quantized folder's own dtype (exporter/mlx_folder.py:
            its packed weights are stored bit for bit).
        max_seq_len: the largest step (tokens per call) and the recorded max context;
            None = min(2048, the model's max_position_embeddings).
        progress: optional ``fn(message)`` called as each long step starts.
        allow_nonfinite: export weights holding NaN or infinity (refused by default).
        quantize: quantize the weights of Linear and Embedding nodes (exporter/quantize.py);
            None keeps every weight in ``dtype``.
        tokenizer: a Hugging Face folder whose tokenizer files (tokenizer.json, its config,
            chat template, generation config) the graph embeds instead of the model's own;
            for checkpoints that come without them.
    Returns:
        stats: nodes, ops (histogram), constants, constant_bytes, file_bytes, seconds,
        timings per step, path, quantization (the recipe and what it did, or None).
    Raises:
        ExportError: unknown model or option (e.g. max_seq_len past the model's
            max_position_embeddings, a quantization recipe out of its domain), an output path
            that cannot be written or is not a regular file, or (without allow_nonfinite)
            weights holding NaN or infinity.
        UnsupportedModelError: the model cannot be exported exactly, in one line that
            names its model type (``e.model_type``) and why; the subclasses say where:
        AdapterError: the model's attention asks for something the graph op cannot do.
        TraceError: torch.export or run_decompositions failed on the model.
        UnsupportedOpsError: ops without a lowering (``e.problems`` lists all of them).
    """
    progress = progress or _no_progress
    if quantize is not None:
        quantize.check()
    if max_seq_len is not None and int(max_seq_len) < 2:
        raise ExportError(f"max_seq_len must be at least 2, got {max_seq_len}", "max_seq_len")
    out_dir = Path(out_path).resolve().parent
    if not out_dir.is_dir():
        raise ExportError(f"{out_path}: the folder {out_dir} does not exist")
    try:
        check_replaceable(out_path)
    except FileExistsError as e:
        raise ExportError(f"{out_path}: {e.strerror}") from None
    timings, t_start = {}, time.perf_counter()

    def step(name, fn):
        progress(name)
        t0 = time.perf_counter()
        result = fn()
        timings[name] = time.perf_counter() - t0
        return result

    files = None if tokenizer is None else read_tokenizer(tokenizer)  # before the long part
    m, source = step("loading", lambda: load_model(model, dtype, quantize is not None))
    dtype, packed = source["dtype"], source.pop("packed", None)
    if files is not None:
        source = {**source, **tokenizer_source(tokenizer, files, embedding_rows(m), source)}
    try:
        check_model(m)
        max_seq_len = resolve_max_seq_len(m.config, max_seq_len, source["source"])
        adapter, writer, lowered = _graph(m, max_seq_len, step)
    except UnsupportedModelError as e:  # every refusal names the model type
        e.model_type = e.model_type or str(getattr(m.config, "model_type", "") or "")
        raise
    writer.metadata = model_info(m, adapter, source, max_seq_len, dtype)
    # Quantizing replaces the float weights: the pages of each are given back once read
    # (exporter/resident_pages.py), so they are never all resident at once. Exported as
    # they are, they are all read again at write, so there is nothing to give back; and a
    # module given is the caller's, whose other threads could write to its weights.
    loaded_here = not isinstance(model, torch.nn.Module)
    pages = ResidentPages() if quantize is not None and loaded_here else None
    refusal = None if allow_nonfinite else nonfinite_weights(writer, pages)
    if refusal:
        raise ExportError(refusal)
    quantized = None
    if quantize is not None:
        quantized = step("quantizing", lambda: quantize_graph(writer, quantize, pages))
    elif packed:
        quantized = step("storing packed weights", lambda: keep_packed(writer, packed, dtype))
    try:
        # Verified before it takes out_path's place: an export reports success only for a
        # file that loads.
        sizes = step("writing", lambda: writer.write(out_path, verify=True))
    except GraphFormatError as e:
        raise ExportError(f"{out_path}: the graph written does not verify, so it was not "
                          f"kept: {e}") from e
    ops = Counter(op_spec(n.op).short_name for n in writer.nodes)
    return {
        "path": str(out_path),
        "model": source["source"],
        # "embedded", "byte" (a built-in's byte vocabulary) or "none"
        "tokenizer": source["tokenizer"] or "none",
        "dtype": dtype,
        "max_seq_len": max_seq_len,
        "nodes": len(writer.nodes),
        "ops": dict(ops.most_common()),
        "tensors": len(writer.tensors),
        "constants": len(writer.constants),
        "constant_bytes": sizes["constant_bytes"],
        "file_bytes": sizes["bytes"],
        "parameters": sum(p.numel() for p in m.parameters()),
        "fusions": lowered["fusions"],
        "quantization": quantized,
        # None, or the element_limit loading needs (a max-context step's largest tensor,
        # e.g. the logits of a long context over a large vocabulary, is past the default).
        "element_limit_needed": sizes.get("element_limit_needed"),
        "seconds": time.perf_counter() - t_start,
        "timings": timings,
    }


__all__ = [
    "export",
    "ExportError",
    "TraceError",
    "AdapterError",
    "UnsupportedOpsError",
    "UnsupportedModelError",
    "load_model",
    "trace",
    "decompose",
    "DTYPES",
    "INPUT_DTYPE",
    "DEFAULT_MAX_SEQ_LEN",
    "QuantizeRecipe",
]
