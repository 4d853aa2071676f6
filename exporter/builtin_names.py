"""The built-in models' names and recipes, as data (no torch): exporter/builtins.py builds
them; tools that only ask whether a name is a built-in (tools/model_graphs.py) read this."""

from pathlib import Path

# name -> the packaged Hugging Face folder of a trained built-in.
TRAINED_BUILTINS = {"tiny-code": Path(__file__).with_name("models") / "tiny-code"}

# name -> (transformers model_type, config overrides on top of builtins._COMMON)
BUILTINS = {
    "tiny-llama": ("llama", {}),
    "tiny-qwen2": ("qwen2", {"num_hidden_layers": 3, "tie_word_embeddings": True}),
    "tiny-mistral": ("mistral", {"sliding_window": 32}),
    "tiny-gemma3": (
        "gemma3_text",
        {
            "head_dim": 32,
            "num_key_value_heads": 1,
            "query_pre_attn_scalar": 32,
            "sliding_window": 32,
            "layer_types": [
                "sliding_attention",
                "sliding_attention",
                "sliding_attention",
                "full_attention",
            ],
            # Untied: Gemma scales the input embedding by sqrt(hidden), so with random tied
            # weights the logits mostly echo the last input token.
            "tie_word_embeddings": False,
        },
    ),
    "tiny-phi3": ("phi3", {"num_hidden_layers": 3, "num_key_value_heads": 4}),
}

__all__ = ["BUILTINS", "TRAINED_BUILTINS"]
