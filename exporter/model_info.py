"""The graph's metadata from a loaded model: geometry, every EOS id, the tokenizer source,
and the max_seq_len the export records."""

import torch

from mlxgraph.exporter.errors import ExportError
from mlxgraph.schema.records import ModelInfo

# The default and largest max_seq_len when the model does not bound it lower.
DEFAULT_MAX_SEQ_LEN = 2048


def _token_ids(value) -> tuple:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def embedding_rows(model) -> int:
    """The rows of the model's token embedding (its text config's vocab_size when the
    embedding module holds no plain weight)."""
    weight = getattr(model.get_input_embeddings(), "weight", None)
    if weight is not None and weight.dim() == 2:
        return int(weight.shape[0])
    cfg = model.config
    return int((cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg).vocab_size)


def model_info(model, adapter, source: dict, max_seq_len: int, dtype: str) -> ModelInfo:
    """The graph's metadata from the model's config and the geometry its attention reported.

    Args:
        model: the ``*ForCausalLM``; adapter: its DecoderAdapter, after a traced forward;
        source: load_model's source info; max_seq_len, dtype: the export's options.
    """
    cfg = model.config
    # A multimodal config (Fuyu's) keeps the decoder's sizes in its text config.
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    gen = getattr(model, "generation_config", None)
    # Every EOS: config's and generation_config's (Llama-3-Instruct ends a turn with
    # <|eot_id|>, listed only in generation_config.json), as transformers and mlx-lm stop.
    eos = _token_ids(getattr(cfg, "eos_token_id", None))
    eos = tuple(dict.fromkeys(eos + _token_ids(getattr(gen, "eos_token_id", None))))
    bos = getattr(cfg, "bos_token_id", None)
    if bos is None and gen is not None:
        bos = gen.bos_token_id
    archs = getattr(cfg, "architectures", None) or [type(model).__name__]
    layers = adapter.layer_infos()
    extra = {
        "model_type": cfg.model_type,
        "dtype": dtype,
        "source": source["source"],
        "torch": torch.__version__,
    }
    if getattr(cfg, "max_position_embeddings", None):
        extra["max_position_embeddings"] = cfg.max_position_embeddings
    return ModelInfo(
        architecture=archs[0],
        num_layers=int(getattr(text, "num_hidden_layers", len(layers))),
        # The embedding's rows: the ids a token may take (a multimodal config such as
        # Fuyu's keeps vocab_size in its text config; Moshi's embedding has a row more).
        vocab_size=embedding_rows(model),
        hidden_size=int(text.hidden_size),
        max_context=int(max_seq_len),
        eos_token_ids=eos,
        bos_token_id=-1 if bos is None else int(bos),
        layers=layers,
        tokenizer=source["tokenizer"],
        extra=extra,
        tokenizer_files=source["files"],
        states=adapter.state_infos(),
    )


def resolve_max_seq_len(config, requested, source: str) -> int:
    """The export's max_seq_len: ``requested``, or min(2048, max_position_embeddings).

    Raises:
        ExportError: ``requested`` exceeds the model's max_position_embeddings, or the
            model has fewer than 2 positions.
    """
    limit = getattr(config, "max_position_embeddings", None)
    if requested is None:
        requested = min(DEFAULT_MAX_SEQ_LEN, int(limit)) if limit else DEFAULT_MAX_SEQ_LEN
    requested = int(requested)
    if limit and requested > int(limit):
        # Past it, learned position tables index out of range and rotary models leave the
        # context they were trained for: the recorded max context would be a promise the
        # model cannot keep.
        raise ExportError(
            f"{source}: max_seq_len {requested} exceeds the model's "
            f"max_position_embeddings {limit}; use max_seq_len <= {limit}",
            "max_seq_len",
        )
    if requested < 2:
        raise ExportError(
            f"{source}: max_seq_len must be at least 2, got {requested}", "max_seq_len"
        )
    return requested


__all__ = ["DEFAULT_MAX_SEQ_LEN", "model_info", "resolve_max_seq_len"]
