"""Built-in tiny models: one trained model, and small configs of real architectures with
seeded random weights.

``tiny-code`` (TRAINED_BUILTINS) is a Hugging Face folder shipped in the package
(exporter/models/tiny-code: a small Llama trained on Python's standard library by
scripts/train_tiny_code.py; its model card says how well); it exports like any folder and
is the one whose text reads like Python.

The random ones need no download: ``export("tiny-llama", ...)`` builds the model in memory. Their
vocabulary is the 256 byte values (tokenizer ``"byte"``: token id = byte value), with
BOS = 2 (ASCII STX, "start of text") and EOS = 3 (ASCII ETX, "end of text").

Weights are drawn wider than Hugging Face's training init (``initializer_range``): with
the usual 0.02 a random model's logits are nearly flat and greedy decoding collapses
into a loop of one or two tokens, which makes a poor demo and a weak test.
"""

import threading

import torch

from mlxgraph.exporter.builtin_names import BUILTINS, TRAINED_BUILTINS

BYTE_BOS, BYTE_EOS = 2, 3
# transformers initialises weights from torch's global generator and builds a model under
# process-global settings (a float16 load switches torch's default dtype for everyone): two
# builds (or folder loads) in two threads at once interfere, and so would a build beside a
# torch.export, so all of them take turns on this one lock (exporter/pipeline.py too).
BUILD_LOCK = threading.RLock()

_COMMON = dict(
    vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
    bos_token_id=BYTE_BOS, eos_token_id=BYTE_EOS, pad_token_id=0, initializer_range=0.25,
    tie_word_embeddings=False,
)

def make_config(model_type: str, **overrides):
    """A transformers config of ``model_type`` with the tiny defaults, then ``overrides``.

    Raises:
        ValueError: transformers does not know the model type.
    """
    from transformers import AutoConfig

    kwargs = {**_COMMON, **overrides}
    return AutoConfig.for_model(model_type, **kwargs)


def build_model(config, seed: int = 0):
    """A ``*ForCausalLM`` for ``config`` with weights drawn from a seeded generator (eval mode)."""
    from transformers import AutoModelForCausalLM

    with BUILD_LOCK:
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config)
        finally:
            torch.random.set_rng_state(state)
    return model.eval()


def builtin_model(name: str, seed: int = 0):
    """The built-in model ``name`` (see BUILTINS).

    Raises:
        KeyError: not a built-in name.
    """
    model_type, overrides = BUILTINS[name]
    return build_model(make_config(model_type, **overrides), seed)


__all__ = ["BUILTINS", "TRAINED_BUILTINS", "BYTE_BOS", "BYTE_EOS", "make_config", "build_model",
           "builtin_model"]
