"""Load what export() was given: a built-in name, a Hugging Face folder, or a module.

A folder is refused from its config.json alone, before any weight is read, when it cannot
be a graph: a model type transformers does not know, one that is not a causal decoder
(no ``*ForCausalLM``: T5, BART...), or weights quantized in a way transformers cannot read
(MLX's ``quantization`` block): one line, an :class:`UnsupportedModelError`. So is a
quantization transformers knows but cannot load here (its message's first line).
"""

import json
from pathlib import Path

import torch

from mlxgraph.exporter.builtins import BUILD_LOCK, BUILTINS, TRAINED_BUILTINS, builtin_model
from mlxgraph.exporter.errors import ExportError, UnsupportedModelError
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
    # (Other quantization methods are transformers' to load; see load_model.)
    mlx = config.get("quantization")
    if isinstance(mlx, dict) and "bits" in mlx:
        return (f"weights quantized by MLX ({mlx.get('bits')} bits, group size "
                f"{mlx.get('group_size')}) are not supported: export the float model it was "
                "made from (--quantize q8/q4 quantizes here)")
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


def load_model(model, dtype: str):
    """(model, source info) for a built-in name, a model folder, or a ready nn.Module.

    Raises:
        ExportError: unknown name, not a model folder, a folder transformers cannot load,
            a checkpoint that lacks weights, a module that is not a transformers model, or
            an unknown dtype.
        UnsupportedModelError: a folder check_config refuses, or quantized weights
            transformers cannot load here.
    """
    if dtype not in DTYPES:
        raise ExportError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}", "dtype")
    if isinstance(model, torch.nn.Module):
        if not hasattr(model, "set_attn_implementation"):
            raise ExportError(
                f"{type(model).__name__} is not a transformers model (export takes a *ForCausalLM)"
            )
        info = {"source": type(model).__name__, "tokenizer": "", "files": {}}
        return model.eval().to(DTYPES[dtype]), info
    name = str(model)
    if name in BUILTINS:
        return builtin_model(name).to(DTYPES[dtype]), {
            "source": name,
            "tokenizer": "byte",
            "files": {},
        }
    # A trained built-in is a Hugging Face folder shipped in the package: the same path as any.
    folder = TRAINED_BUILTINS.get(name, Path(name))
    if not (folder / "config.json").is_file():
        known = ", ".join([*TRAINED_BUILTINS, *BUILTINS])
        raise ExportError(
            f"unknown model {name!r}: not a folder with config.json, nor a built-in ({known})"
        )
    config = read_config(folder)
    check_config(config)
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
    files = {}
    if (folder / "tokenizer.json").is_file():
        try:
            files = read_tokenizer_folder(folder)
        except TokenizerFilesError as e:
            raise ExportError(f"cannot embed the tokenizer: {e}") from None
    # The folder's name only: the exporting machine's paths stay out of the file.
    return m.eval(), {
        "source": folder.resolve().name,
        "tokenizer": "embedded" if files else "",
        "files": files,
    }


def _first_line(e: Exception, limit: int = 300) -> str:
    # transformers' messages can run to thousands of characters (every model type it knows).
    lines = str(e).strip().splitlines() or [""]
    line = lines[0]
    return line if len(line) <= limit else line[:limit] + "..."


__all__ = ["DTYPES", "check_config", "load_model", "read_config"]
