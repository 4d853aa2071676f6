"""Folders of MLX-quantized weights (mlx-lm's ``convert -q``: the mlx-community models).

Such a folder is a Hugging Face folder whose config.json has a ``quantization`` block
(``bits``, ``group_size``, optional ``mode`` and per-module overrides) and whose quantized
modules hold ``<module>.weight`` (uint32, packed), ``<module>.scales`` and
``<module>.biases``: exactly the layout of the graph's QuantizedLinear/QuantizedEmbedding
(MLX's ``mx.quantize``, docs/architecture.md#quantized-weights). So the export traces a
transformers model built with the *dequantized* weights (shapes and ops are all tracing
needs) and then stores the folder's packed weights, scales and biases themselves, bit for
bit (exporter/quantize.py ``keep_packed``): the graph computes what mlx-lm computes on
the folder. What the format cannot hold exactly (other modes, 2/3/5/6 bits, group sizes
other than 32/64/128, weights named as mlx-lm's own modules rather than transformers')
is refused in one line.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mlxgraph.exporter.errors import ExportError, UnsupportedModelError
from mlxgraph.exporter.quantize import GROUP_SIZES, MODES

BITS = tuple(sorted(MODES.values()))
TORCH_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclass(frozen=True)
class PackedWeight:
    """One module's weight as the folder stores it: codes packed in uint32 words, and the
    scales and biases of each group of ``group_size`` weights."""

    packed: np.ndarray  # uint32 [N, K * bits / 32]
    scales: torch.Tensor  # [N, K / group_size]
    biases: torch.Tensor
    bits: int
    group_size: int

    def dequantized(self) -> torch.Tensor:
        """W = scales * code + biases, [N, K], in the scales' dtype (computed in float32)."""
        per_word = 32 // self.bits
        words = torch.from_numpy(self.packed.astype(np.int64))
        shifts = torch.arange(per_word, dtype=torch.int64) * self.bits
        codes = ((words[..., None] >> shifts) & (2**self.bits - 1)).reshape(words.shape[0], -1)
        scales = self.scales.to(torch.float32).repeat_interleave(self.group_size, dim=-1)
        biases = self.biases.to(torch.float32).repeat_interleave(self.group_size, dim=-1)
        return (codes.to(torch.float32) * scales + biases).to(self.scales.dtype)


def mlx_quantization(config: dict) -> dict | None:
    """config.json's MLX ``quantization`` block, or None when the folder is not one."""
    block = config.get("quantization")
    return block if isinstance(block, dict) and "bits" in block else None


def _refuse(config: dict, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"MLX-quantized weights: {why}", config.get("model_type"))


def check_mlx_quantization(config: dict) -> None:
    """Refuse, from config.json alone, an MLX quantization the graph cannot store as it is.

    Raises:
        UnsupportedModelError: a mode other than affine, or bits / group size out of the
            format's domain (globally or for one module).
    """
    block = mlx_quantization(config)
    entries = {"": block, **{k: v for k, v in block.items() if isinstance(v, dict)}}
    for module, params in entries.items():
        where = f" ({module})" if module else ""
        mode = params.get("mode", block.get("mode", "affine"))
        if mode != "affine":
            raise _refuse(config, f"mode {mode!r}{where} is not supported (affine only)")
        bits, group = params.get("bits", block["bits"]), params.get(
            "group_size", block.get("group_size", 64))
        if bits not in BITS:
            raise _refuse(config, f"{bits} bits{where}: the graph stores 4 or 8")
        if group not in GROUP_SIZES:
            raise _refuse(config, f"group size {group}{where}: the graph stores "
                          f"{', '.join(map(str, GROUP_SIZES))}")


def _read_tensors(folder: Path) -> dict:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{folder}: no *.safetensors weights")
    tensors = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    tensors[key] = f.get_tensor(key)
        except Exception as e:  # a malformed file: the folder's fault
            raise ExportError(f"{path}: cannot read it: {e}") from None
    return tensors


def _packed(module: str, tensors: dict, config: dict) -> PackedWeight:
    block = mlx_quantization(config)
    override = block.get(module) if isinstance(block.get(module), dict) else {}
    group = override.get("group_size", block.get("group_size", 64))
    want_bits = override.get("bits", block["bits"])
    weight, scales = tensors[f"{module}.weight"], tensors[f"{module}.scales"]
    biases = tensors.get(f"{module}.biases")
    if biases is None:
        raise _refuse(config, f"{module} has no biases (not affine)")
    if weight.dtype not in (torch.uint32, torch.int32) or weight.ndim != 2 or scales.ndim != 2:
        raise _refuse(config, f"{module}: a packed weight of {weight.dtype} "
                      f"{tuple(weight.shape)} is not MLX's 2-D uint32 layout")
    cols = scales.shape[1] * group
    bits = weight.shape[1] * 32 // cols if cols else 0
    if bits != want_bits or weight.shape[1] * 32 != cols * bits or biases.shape != scales.shape:
        raise _refuse(config, f"{module}: shapes {tuple(weight.shape)} / {tuple(scales.shape)} "
                      f"do not match {want_bits} bits in groups of {group}")
    packed = weight.contiguous().view(torch.int32).numpy().view(np.uint32)
    return PackedWeight(packed, scales, biases, bits, group)


def load_mlx_folder(folder: Path, config: dict, dtype: str | None):
    """(float model for tracing, {weight name: PackedWeight}, graph dtype) of an MLX folder.

    The graph's dtype is the folder's float dtype unless ``dtype`` asks for float32 (its
    scales widen exactly); a narrower dtype would change the weights and is refused.

    Raises:
        UnsupportedModelError: see check_mlx_quantization; weights the transformers model
            does not name (mlx-lm's own module layout), or a narrowing dtype.
        ExportError: unreadable weights.
    """
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from mlxgraph.exporter.builtins import BUILD_LOCK

    check_mlx_quantization(config)
    tensors = _read_tensors(folder)
    packed = {f"{m[:-len('.scales')]}.weight": _packed(m[:-len(".scales")], tensors, config)
              for m in tensors if m.endswith(".scales")}
    floats = [t.dtype for k, t in tensors.items() if t.is_floating_point()]
    own = TORCH_DTYPES.get(floats[0] if floats else torch.float32, "float32")
    dtype = dtype or own
    if dtype not in (own, "float32"):
        raise _refuse(config, f"the folder's weights are {own}: export them as {own} or "
                      f"float32, not {dtype} (it would round them)")
    torch_dtype = {v: k for k, v in TORCH_DTYPES.items()}[dtype]
    state = {}
    for key, t in tensors.items():
        module = key.rsplit(".", 1)[0]
        if f"{module}.weight" in packed and key != f"{module}.weight":
            continue  # a packed weight's scales and biases
        state[key] = (packed[key].dequantized() if key in packed else t).to(torch_dtype)
    hf_config = AutoConfig.from_pretrained(folder)
    for name in ("quantization", "quantization_config"):
        if hasattr(hf_config, name):
            delattr(hf_config, name)
    with BUILD_LOCK:
        model, loading = MODEL_FOR_CAUSAL_LM_MAPPING[type(hf_config)].from_pretrained(
            None, config=hf_config, state_dict=state, dtype=torch_dtype,
            output_loading_info=True)
    odd = sorted(loading.get("missing_keys", ())) + sorted(loading.get("unexpected_keys", ()))
    if odd:
        raise _refuse(config, f"the weights are not named as transformers' "
                      f"{type(model).__name__} names them ({len(odd)} differ, e.g. {odd[0]}): "
                      "mlx-lm's own layout for this model is not supported")
    return model.eval(), _with_tied_names(model, packed), dtype


def _with_tied_names(model, packed: dict) -> dict:
    """``packed`` also under every other name of a tied parameter (a tied LM head is traced
    under its own name, lm_head.weight, while the folder stores the embedding's)."""
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(p.data_ptr(), []).append(name)
    out = dict(packed)
    for group in names.values():
        found = next((packed[n] for n in group if n in packed), None)
        if found is not None:
            out.update(dict.fromkeys(group, found))
    return out


__all__ = ["PackedWeight", "check_mlx_quantization", "load_mlx_folder", "mlx_quantization"]
