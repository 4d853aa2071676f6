"""Quantized weights at export: a lowered graph's Linear and Embedding nodes of constant
weights rewritten to QuantizedLinear / QuantizedEmbedding nodes (format 1.2).

The layout is MLX's ``mx.quantize`` (schema/mlxgraph.fbs, docs/architecture.md#quantized-
weights): per row, groups of ``group_size`` weights share a scale and a bias (affine,
min/max), codes of ``bits`` bits packed into uint32 words, the first in the lowest bits.
The recipe (bits, group size, the embedding's and LM head's own precision, module
exclusions) is recorded in the file's metadata (``extra["quantization"]``, JSON).
"""

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import numpy as np
import torch

from mlxgraph.exporter.errors import ExportError
from mlxgraph.exporter.quantize_tables import float_weights, quantized_table_nodes, table_refusal
from mlxgraph.schema.dtypes import dtype_info
from mlxgraph.schema.op_catalogue import Trait, entry, quantized_form
from mlxgraph.schema.records import NodeRecord

MODES = {"q8": 8, "q4": 4}
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 64
SCALE_DTYPES = ("float16", "float32")
# A float16 scale below this is subnormal (fewer significant bits); the weight then keeps
# float32 scales and biases, as it does when a value would overflow float16.
_FLOAT16_NORMAL, _FLOAT16_MAX = 2.0**-14, 65504.0
# The module path of the output projection in a *ForCausalLM (the adapter strips "model.").
LM_HEAD = "lm_head"


@dataclass(frozen=True)
class QuantizeRecipe:
    """What to quantize and how.

    Attributes:
        mode: 'q8' or 'q4', the default precision of every Linear of a constant weight.
        group_size: weights per scale and bias (32, 64 or 128).
        embedding: the token embedding's precision: 'q8', 'q4', 'float' or None (= mode).
        lm_head: the output projection's precision, likewise.
        exclude: module-path patterns (fnmatch, e.g. 'layers.0.*') kept in float.
        scales: the dtype of a float32 weight's scales and biases: 'float16' (the default:
            a q4 weight then takes 4.5 bits per value instead of 5, the size of llama.cpp's
            q4_0) or 'float32'. A weight whose scales float16 cannot hold (overflow, or a
            non-zero scale below float16's normal range) keeps float32. Weights of a
            float16 or bfloat16 graph keep their own dtype.
    """

    mode: str
    group_size: int = DEFAULT_GROUP_SIZE
    embedding: str | None = None
    lm_head: str | None = None
    exclude: tuple = field(default_factory=tuple)
    scales: str = "float16"

    def check(self) -> None:
        """Raises ExportError naming the option when a value is out of its domain."""
        if self.mode not in MODES:
            raise ExportError(f"unknown quantization {self.mode!r}: choose q8 or q4", "quantize")
        if self.group_size not in GROUP_SIZES:
            raise ExportError(
                f"group size {self.group_size} is not one of {', '.join(map(str, GROUP_SIZES))}",
                "group_size",
            )
        if self.scales not in SCALE_DTYPES:
            raise ExportError(f"scales dtype {self.scales!r}: choose float16 or float32",
                              "quantize_scales")
        for name in ("embedding", "lm_head"):
            value = getattr(self, name)
            if value is not None and value not in (*MODES, "float"):
                raise ExportError(
                    f"{name} precision {value!r}: choose q8, q4 or float", f"quantize_{name}"
                )

    def precision(self, op: str, module: str, token_table: bool = True) -> str:
        """'q8', 'q4' or 'float' for a node of ``op`` from ``module``; ``token_table``: an
        embedding reads the ``tokens`` input (other tables take the mode)."""
        if any(fnmatchcase(module, pattern) for pattern in self.exclude):
            return "float"
        if entry(op).has(Trait.EMBEDDING) and token_table:
            return self.embedding or self.mode
        if module == LM_HEAD:
            return self.lm_head or self.mode
        return self.mode


# Elements quantized at a time (whole rows): a block's temporaries (float32 differences,
# codes, their uint32 copy) stay ~4 MB each whatever the weight's size; the whole tensor's
# (float32 groups, int64 codes and shifted codes) came to ~8x a 32k x 1024 embedding's
# bytes, the export's peak memory. 4M-element blocks still added ~145 MB to the peak.
# Every step is elementwise or per row, so blocks give the bytes the whole tensor gave.
_BLOCK_ELEMENTS = 1 << 20


def _row_blocks(w: torch.Tensor):
    """Row ranges (start, stop) of at most about _BLOCK_ELEMENTS elements each."""
    step = max(1, _BLOCK_ELEMENTS // max(1, w.shape[1]))
    return [(start, min(start + step, w.shape[0])) for start in range(0, w.shape[0], step)]


def group_ranges(w: torch.Tensor, group_size: int):
    """(each group's min, each group's max) of a [N, K] weight, float32 [N, K/g] each."""
    lo = torch.empty((w.shape[0], w.shape[1] // group_size), dtype=torch.float32)
    hi = torch.empty_like(lo)
    for start, stop in _row_blocks(w):
        groups = w[start:stop].to(torch.float32).reshape(stop - start, -1, group_size)
        torch.amin(groups, -1, out=lo[start:stop])
        torch.amax(groups, -1, out=hi[start:stop])
    return lo, hi


def _fits_float16(ranges, bits: int) -> bool:
    """Whether float16 holds the scales and biases of a weight of these group ``ranges``
    (group_ranges) to its full precision."""
    biases, hi = ranges
    scales = (hi - biases) / (2**bits - 1)
    nonzero = scales[scales != 0]
    return bool(torch.isfinite(scales).all() and torch.isfinite(biases).all()
                and scales.abs().max() <= _FLOAT16_MAX and biases.abs().max() <= _FLOAT16_MAX
                and (nonzero.numel() == 0 or nonzero.abs().min() >= _FLOAT16_NORMAL))


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint32 words of ``32 / bits`` codes each, the first in the lowest bits."""
    per_word = 32 // bits
    codes = codes.reshape(codes.shape[0], -1, per_word)
    packed = codes[..., 0].copy()
    for i in range(1, per_word):
        packed |= codes[..., i] << np.uint32(i * bits)
    return packed


def quantize_weight(w: torch.Tensor, bits: int, group_size: int, scales_dtype=None,
                    ranges=None):
    """(packed uint32 [N, K*bits/32], scales [N, K/g], biases [N, K/g]) of a [N, K] weight.

    Scales and biases take ``scales_dtype`` (default: w's dtype); codes are computed against
    the rounded scale and bias, so the dequantized weight is the nearest the stored
    parameters can express. ``ranges``: w's group_ranges when already computed. The codes
    are computed a block of rows at a time (_BLOCK_ELEMENTS).

    Raises:
        ValueError: w is not 2-D, or K is not a multiple of group_size.
    """
    if w.ndim != 2 or w.shape[1] % group_size:
        raise ValueError(f"cannot quantize a weight of shape {tuple(w.shape)} in groups of "
                         f"{group_size}")
    rows, cols = w.shape
    levels = 2**bits - 1
    lo, hi = ranges if ranges is not None else group_ranges(w, group_size)
    scales = ((hi - lo) / levels).to(scales_dtype or w.dtype)
    biases = lo.to(scales_dtype or w.dtype)
    scale32, bias32 = scales.to(torch.float32), biases.to(torch.float32)
    safe = torch.where(scale32 == 0, torch.ones_like(scale32), scale32)
    packed = np.empty((rows, cols * bits // 32), dtype=np.uint32)
    for start, stop in _row_blocks(w):
        groups = w[start:stop].to(torch.float32).reshape(stop - start, -1, group_size)
        codes = torch.round((groups - bias32[start:stop, :, None])
                            / safe[start:stop, :, None]).clamp_(0, levels)
        # (codes are whole numbers in [0, levels]: the conversion is exact)
        packed[start:stop] = _pack(codes.reshape(stop - start, cols).numpy().astype(np.uint32),
                                   bits)
    return packed, scales, biases


@contextmanager
def _one_torch_thread():
    """torch's intra-op threads set to one for the block, then restored (for this thread:
    OpenMP's count is per thread). Quantizing is a few elementwise passes over blocks of a
    few MB; with more threads every op waits for the pool's helpers, and on a busy machine
    those waits dominate: 20 s instead of 3.3 s for a 156M Llama at load 5 on 2 cores
    (benchmarks/quantize_export_bench.py). The bytes do not depend on the thread count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _as_torch(data: np.ndarray, dtype: str) -> torch.Tensor:
    """A constant's array as a tensor sharing its memory (quantizing only reads it): a
    copy of every weight would add the whole model's float bytes to the export's peak."""
    if dtype == "bfloat16":
        data = data.view(np.int16)
    if not data.flags.writeable:  # (torch.from_numpy warns on a read-only array)
        data = data.copy()
    t = torch.from_numpy(data)
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def as_numpy(t: torch.Tensor):
    """(array, dtype name) for GraphWriter.add_constant (bfloat16 as its bit pattern)."""
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16), "bfloat16"
    return t.contiguous().numpy(), str(t.numpy().dtype)


def _scales_dtype(w: torch.Tensor, bits: int, recipe: QuantizeRecipe, ranges=None):
    """The dtype of w's scales and biases under ``recipe`` (see QuantizeRecipe.scales);
    ``ranges``: w's group_ranges when already computed."""
    if w.dtype != torch.float32 or recipe.scales == "float32":
        return w.dtype
    if ranges is None:
        ranges = group_ranges(w, recipe.group_size)
    return torch.float16 if _fits_float16(ranges, bits) else torch.float32


def _why_float(recipe: QuantizeRecipe, module: str, token_table: bool) -> str:
    """Why the recipe keeps a node's weight in float (its precision is 'float')."""
    patterns = [p for p in recipe.exclude if fnmatchcase(module, p)]
    if patterns:
        return f"--quantize-exclude {patterns[0]}"
    return "--quantize-embedding float" if token_table else "--quantize-lm-head float"


def quantize_graph(writer, recipe: QuantizeRecipe, pages=None) -> dict:
    """Rewrite ``writer``'s Linear and Embedding nodes of constant float weights in place.

    Only the token embedding (the table the ``tokens`` input indexes) takes the recipe's
    embedding precision; other tables (positions, experts) take its mode. A table of more
    than two axes (expert weights) becomes a QuantizedEmbedding of its flattened rows and a
    Reshape (exporter/quantize_tables.py). A weight that cannot be quantized exactly (a
    row length no multiple of the group size) stays in float; every float weight left is
    listed with why. Float constants no longer read by any node are dropped. ``pages``: a
    resident_pages.ResidentPages given back each float weight's pages once quantized.

    Returns:
        the record stored in metadata extra["quantization"] (also returned for stats).
    Raises:
        ExportError: the recipe is invalid.
    """
    recipe.check()
    constants = {slot: data for slot, data, _ in writer.constants}
    tokens = dict(writer.inputs).get("tokens")
    quantized, reasons, nodes = {}, {}, []
    counts = {"q8": 0, "q4": 0, "float": 0}
    scale_counts = {"float16": 0, "float32": 0}
    for node in writer.nodes:
        nodes.append(node)
        quantized_op = quantized_form(node.op)
        if quantized_op is None:
            continue
        slot = node.fields.get("weight")
        name, code, shape = writer.tensors[slot]
        if slot not in constants or code is None or not dtype_info(code).is_float:
            continue
        module = node.provenance.module_path
        table = entry(node.op).has(Trait.EMBEDDING)
        token_table = table and node.fields.get("indices") == tokens
        precision = recipe.precision(node.op, module, token_table)
        why = None
        if precision == "float":
            why = _why_float(recipe, module, token_table)
        elif table and len(shape) > 2:
            why = table_refusal(writer, node, recipe.group_size)
        elif len(shape) != 2 or shape[1] % recipe.group_size:
            why = f"in_features {shape[-1]} is not a multiple of {recipe.group_size}"
        if why is not None:
            reasons.setdefault(slot, why)
            precision = "float"
        counts[precision] += 1
        if precision == "float":
            continue
        bits = MODES[precision]
        key = (slot, bits)
        if key not in quantized:
            w = _as_torch(constants[slot], dtype_info(code).name)
            w = w.reshape(w.shape[0], -1)  # a table's rows flattened (quantize_tables.py)
            with _one_torch_thread():
                ranges = group_ranges(w, recipe.group_size)  # (read once for both)
                packed, scales, biases = quantize_weight(
                    w, bits, recipe.group_size, _scales_dtype(w, bits, recipe, ranges), ranges)
            if pages is not None:
                pages.release(constants[slot])
            if w.dtype == torch.float32:
                scale_counts[str(scales.dtype).removeprefix("torch.")] += 1
            quantized[key] = (
                writer.add_constant(f"{name}.q{bits}", packed, "uint32"),
                writer.add_constant(f"{name}.scales{bits}", *as_numpy(scales)),
                writer.add_constant(f"{name}.biases{bits}", *as_numpy(biases)),
            )
        packed_slot, scales_slot, biases_slot = quantized[key]
        fields = dict(node.fields, weight=packed_slot, scales=scales_slot, biases=biases_slot,
                      group_size=recipe.group_size, bits=bits)
        if len(shape) > 2:
            nodes[-1:] = quantized_table_nodes(writer, node, quantized_op.table, fields)
        else:
            nodes[-1] = NodeRecord(quantized_op.table, fields, node.provenance)
    writer.nodes = nodes
    writer.drop_unread_constants()
    record = {
        "mode": recipe.mode,
        "group_size": recipe.group_size,
        "embedding": recipe.embedding or recipe.mode,
        "lm_head": recipe.lm_head or recipe.mode,
        "exclude": list(recipe.exclude),
        "nodes": counts,
        "kept_float": float_weights(writer, reasons),
        "scales": recipe.scales,
        "scales_dtypes": scale_counts,
    }
    writer.metadata.extra["quantization"] = json.dumps(record, sort_keys=True)
    return record


__all__ = ["QuantizeRecipe", "quantize_graph", "quantize_weight", "as_numpy", "MODES",
           "GROUP_SIZES", "DEFAULT_GROUP_SIZE", "SCALE_DTYPES"]
