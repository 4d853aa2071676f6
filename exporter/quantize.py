"""Quantized weights at export: a lowered graph's Linear and Embedding nodes of constant
weights rewritten to QuantizedLinear / QuantizedEmbedding nodes (format 1.2).

The layout is MLX's ``mx.quantize`` (schema/mlxgraph.fbs, docs/architecture.md#quantized-
weights): per row, groups of ``group_size`` weights share a scale and a bias (affine,
min/max), codes of ``bits`` bits packed into uint32 words, the first in the lowest bits.
The recipe (bits, group size, the embedding's and LM head's own precision, module
exclusions) is recorded in the file's metadata (``extra["quantization"]``, JSON).
"""

import json
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


def _groups(w: torch.Tensor, group_size: int):
    """(w as float32 [N, K/g, g], each group's min, each group's max)."""
    groups = w.detach().to(torch.float32).reshape(w.shape[0], -1, group_size)
    return groups, groups.amin(-1), groups.amax(-1)


def _fits_float16(w: torch.Tensor, bits: int, group_size: int) -> bool:
    """Whether float16 holds w's scales and biases to its full precision."""
    _, biases, hi = _groups(w, group_size)
    scales = (hi - biases) / (2**bits - 1)
    nonzero = scales[scales != 0]
    return bool(torch.isfinite(scales).all() and torch.isfinite(biases).all()
                and scales.abs().max() <= _FLOAT16_MAX and biases.abs().max() <= _FLOAT16_MAX
                and (nonzero.numel() == 0 or nonzero.abs().min() >= _FLOAT16_NORMAL))


def quantize_weight(w: torch.Tensor, bits: int, group_size: int, scales_dtype=None):
    """(packed uint32 [N, K*bits/32], scales [N, K/g], biases [N, K/g]) of a [N, K] weight.

    Scales and biases take ``scales_dtype`` (default: w's dtype); codes are computed against
    the rounded scale and bias, so the dequantized weight is the nearest the stored
    parameters can express.

    Raises:
        ValueError: w is not 2-D, or K is not a multiple of group_size.
    """
    if w.ndim != 2 or w.shape[1] % group_size:
        raise ValueError(f"cannot quantize a weight of shape {tuple(w.shape)} in groups of "
                         f"{group_size}")
    rows, cols = w.shape
    levels = 2**bits - 1
    groups, lo, hi = _groups(w, group_size)
    scales = ((hi - lo) / levels).to(scales_dtype or w.dtype)
    biases = lo.to(scales_dtype or w.dtype)
    scale32, bias32 = scales.to(torch.float32), biases.to(torch.float32)
    safe = torch.where(scale32 == 0, torch.ones_like(scale32), scale32)
    codes = torch.round((groups - bias32[..., None]) / safe[..., None]).clamp_(0, levels)
    per_word = 32 // bits
    codes = codes.to(torch.int64).reshape(rows, cols // per_word, per_word)
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    packed = (codes << shifts).sum(-1).numpy().astype(np.uint32)
    return packed, scales, biases


def _as_torch(data: np.ndarray, dtype: str) -> torch.Tensor:
    if dtype == "bfloat16":
        return torch.from_numpy(data.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(data))


def as_numpy(t: torch.Tensor):
    """(array, dtype name) for GraphWriter.add_constant (bfloat16 as its bit pattern)."""
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16), "bfloat16"
    return t.contiguous().numpy(), str(t.numpy().dtype)


def _scales_dtype(w: torch.Tensor, bits: int, recipe: QuantizeRecipe):
    """The dtype of w's scales and biases under ``recipe`` (see QuantizeRecipe.scales)."""
    if w.dtype != torch.float32 or recipe.scales == "float32":
        return w.dtype
    return torch.float16 if _fits_float16(w, bits, recipe.group_size) else torch.float32


def _why_float(recipe: QuantizeRecipe, module: str, token_table: bool) -> str:
    """Why the recipe keeps a node's weight in float (its precision is 'float')."""
    patterns = [p for p in recipe.exclude if fnmatchcase(module, p)]
    if patterns:
        return f"--quantize-exclude {patterns[0]}"
    return "--quantize-embedding float" if token_table else "--quantize-lm-head float"


def quantize_graph(writer, recipe: QuantizeRecipe) -> dict:
    """Rewrite ``writer``'s Linear and Embedding nodes of constant float weights in place.

    Only the token embedding (the table the ``tokens`` input indexes) takes the recipe's
    embedding precision; other tables (positions, experts) take its mode. A table of more
    than two axes (expert weights) becomes a QuantizedEmbedding of its flattened rows and a
    Reshape (exporter/quantize_tables.py). A weight that cannot be quantized exactly (a
    row length no multiple of the group size) stays in float; every float weight left is
    listed with why. Float constants no longer read by any node are dropped.

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
            packed, scales, biases = quantize_weight(w, bits, recipe.group_size,
                                                     _scales_dtype(w, bits, recipe))
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
