"""Load what export() was given: a built-in name, a Hugging Face folder, a Hub repo id (its
folder in the Hub's cache, exporter/hub.py), or a module.

A folder is refused from its config.json alone, before any weight is read, when it cannot
be a graph: a model type transformers does not know, one that is not a causal decoder
(no ``*ForCausalLM``: T5, BART...), or weights quantized in a way neither transformers nor
exporter/mlx_folder.py (MLX's ``quantization`` block) can read: one line, an
:class:`UnsupportedModelError`. So is a
quantization transformers knows but cannot load here (its message's first line).
"""

import json
from pathlib import Path

import torch

from mlxgraph.exporter.builtins import BUILD_LOCK, BUILTINS, TRAINED_BUILTINS, builtin_model
from mlxgraph.exporter.errors import ExportError, UnsupportedModelError
from mlxgraph.exporter.hub import hub_folder, looks_like_repo_id
from mlxgraph.exporter.mlx_folder import check_mlx_quantization, load_mlx_folder, mlx_quantization
from mlxgraph.schema.tokenizer_files import TokenizerFilesError, read_tokenizer_folder

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def read_config(folder: Path) -> dict:
    """config.json as a dict.

    Raises:
        ExportError: not readable, not JSON, or not an object (a bad file: exit 2).
    """
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ExportError(f"{folder / 'config.json'}: cannot read it: {e}") from None
    if not isinstance(config, dict):
        raise ExportError(f"{folder / 'config.json'}: not a JSON object")
    return config


def _quantized(config: dict) -> str | None:
    # (MLX's own block is exporter/mlx_folder.py's; other methods are transformers' to load.)
    if mlx_quantization(config):
        return None
    hf = config.get("quantization_config")
    if hf and not (isinstance(hf, dict) and hf.get("quant_method")):
        return "quantized weights of an unknown kind (a quantization_config without quant_method)"
    return None


def _quant_method(config: dict) -> str:
    hf = config.get("quantization_config")
    return str(hf.get("quant_method")) if isinstance(hf, dict) else ""


def check_config(config: dict) -> None:
    """Refuse, from config.json alone, a folder that cannot be exported.

    Raises:
        UnsupportedModelError: an unknown model type, not a causal decoder, or quantized
            weights (``model_type`` set to the config's).
    """
    from transformers import CONFIG_MAPPING, __version__
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise UnsupportedModelError("config.json names no model_type, so the architecture is "
                                    "unknown")
    if model_type not in CONFIG_MAPPING:
        custom = (" (code shipped with a model, auto_map, is not run)"
                  if "auto_map" in config else "")
        raise UnsupportedModelError(
            f"model type unknown to transformers {__version__}{custom}", model_type)
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        kind = "an encoder-decoder model" if config.get("is_encoder_decoder") else "a model"
        raise UnsupportedModelError(
            f"not a causal decoder: {kind} without a *ForCausalLM class in transformers",
            model_type)
    why = _quantized(config)
    if why:
        raise UnsupportedModelError(why, model_type)
    if mlx_quantization(config):
        check_mlx_quantization(config)


def load_model(model, dtype: str | None, requantize: bool = False):
    """(model, source info) for a built-in name, a model folder, or a ready nn.Module.

    ``dtype`` None is float32, or an MLX-quantized folder's own dtype; the info's "dtype"
    says which, and for such a folder "packed" holds its packed weights by name
    (exporter/mlx_folder.py). ``requantize``: the caller quantizes (refused for such a
    folder, before its weights are read).

    Raises:
        ExportError: unknown name, not a model folder, a folder transformers cannot load,
            a checkpoint that lacks weights, a module that is not a transformers model, or
            an unknown dtype.
        UnsupportedModelError: a folder check_config refuses, or quantized weights
            transformers cannot load here.
    """
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}", "dtype")
    if isinstance(model, torch.nn.Module):
        if not hasattr(model, "set_attn_implementation"):
            raise ExportError(
                f"{type(model).__name__} is not a transformers model (export takes a *ForCausalLM)"
            )
        dtype = dtype or "float32"
        info = {"source": type(model).__name__, "tokenizer": "", "files": {}, "dtype": dtype}
        return model.eval().to(DTYPES[dtype]), info
    name = str(model)
    if name in BUILTINS:
        dtype = dtype or "float32"
        return builtin_model(name).to(DTYPES[dtype]), {
            "source": name,
            "tokenizer": "byte",
            "files": {},
            "dtype": dtype,
        }
    # A trained built-in is a Hugging Face folder shipped in the package: the same path as any.
    folder = TRAINED_BUILTINS.get(name, Path(name))
    hub = name not in TRAINED_BUILTINS and looks_like_repo_id(name)
    if hub:
        folder = hub_folder(name)
    if not (folder / "config.json").is_file():
        known = ", ".join([*TRAINED_BUILTINS, *BUILTINS])
        where = "its Hub files have no config.json" if hub else (
            f"not a folder with config.json, a Hub repo id (org/name), nor a built-in ({known})")
        raise ExportError(f"unknown model {name!r}: {where}")
    config = read_config(folder)
    check_config(config)
    packed = None
    if mlx_quantization(config):
        if requantize:
            raise ExportError("the folder's weights are already quantized by MLX and are stored "
                              "as they are: drop --quantize", "quantize")
        m, packed, dtype = load_mlx_folder(folder, config, dtype)
    else:
        dtype = dtype or "float32"
        m = _from_pretrained(folder, config, dtype)
    files = {}
    if (folder / "tokenizer.json").is_file():
        try:
            files = read_tokenizer_folder(folder)
        except TokenizerFilesError as e:
            raise ExportError(f"cannot embed the tokenizer: {e}") from None
    # The folder's name (or the repo id) only: the exporting machine's paths stay out of
    # the file.
    return m.eval(), {
        "source": name if hub else folder.resolve().name,
        "tokenizer": "embedded" if files else "",
        "files": files,
        "dtype": dtype,
        "packed": packed,
    }


def _from_pretrained(folder: Path, config: dict, dtype: str):
    """transformers' model of ``folder``; raises ExportError / UnsupportedModelError."""
    from transformers import AutoModelForCausalLM

    try:  # (transformers' model building has process-global state: builds take turns)
        with BUILD_LOCK:
            m, loading = AutoModelForCausalLM.from_pretrained(
                folder, dtype=DTYPES[dtype], output_loading_info=True)
    except Exception as e:  # config, weights, safetensors, missing code: all the folder's fault
        why = f"{type(e).__name__}: {_first_line(e)}"
        if _quant_method(config):  # a quantization this transformers cannot load here
            raise UnsupportedModelError(
                f"weights quantized by {_quant_method(config)!r} cannot be loaded: {why}",
                config["model_type"]) from e
        raise ExportError(f"{folder}: cannot load the model: {why}") from e
    # transformers fills what the checkpoint lacks with random weights and only logs it;
    # a graph of partly random weights must not look like a successful export.
    # (Weights of the wrong shape already fail the load.)
    missing = sorted(loading.get("missing_keys", ()))
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise ExportError(f"{folder}: the checkpoint lacks {len(missing)} weight(s): {shown}")
    return m


def _first_line(e: Exception, limit: int = 300) -> str:
    # transformers' messages can run to thousands of characters (every model type it knows).
    lines = str(e).strip().splitlines() or [""]
    line = lines[0]
    return line if len(line) <= limit else line[:limit] + "..."


__all__ = ["DTYPES", "check_config", "load_model", "read_config"]
