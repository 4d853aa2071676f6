"""Shared fixtures: tiny Hugging Face model folders (config + safetensors, random weights).

``tiny_hf_folder(arch)`` returns a folder saved once per test session, for any test that
wants a real model folder on disk. The configs are small (2-3 layers, hidden 64, the 256
byte vocabulary) so exporting one takes a few seconds. torch runs one thread per test process.
"""

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# make test runs one pytest-xdist worker per CPU: one BLAS thread each, or the workers'
# BLAS threads (the default policy uses every CPU for large products) oversubscribe the
# cores. Tests of the thread policy set their own value in a subprocess.
os.environ.setdefault("MLXGRAPH_BLAS_THREADS", "1")

try:
    import torch
except ImportError:  # an install without the export extra: the torch tests are skipped
    torch = None
else:
    # One intra-op thread per test process: make test runs one pytest-xdist worker per core,
    # and torch's default (a thread per core, each spinning while it waits for work) turns a
    # tiny model's decode step into milliseconds of spinning per Linear (10x the CPU time).
    torch.set_num_threads(1)
# The same for a test's own child processes that run torch (a fresh-process export, a
# transformers oracle): OpenMP reads this at start.
TORCH_CHILD_ENV = {"OMP_NUM_THREADS": "1"}

# arch -> (transformers model_type, config overrides). Sliding windows are smaller than the
# parity tests' context (17 + 40 tokens) so the window is really exercised.
TINY_ARCHS = {
    "llama": ("llama", {"num_hidden_layers": 2}),
    "qwen2": ("qwen2", {"num_hidden_layers": 2, "tie_word_embeddings": True}),
    "mistral": ("mistral", {"num_hidden_layers": 2, "sliding_window": 8}),
    "gemma3": (
        "gemma3_text",
        {
            "num_hidden_layers": 3,
            "head_dim": 32,
            "num_key_value_heads": 1,
            "query_pre_attn_scalar": 32,
            "sliding_window": 8,
            "tie_word_embeddings": True,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        },
    ),
    "phi3": ("phi3", {"num_hidden_layers": 2, "num_key_value_heads": 4}),
}
_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}


def tiny_hf_model(arch: str, seed: int = 0):
    """A fresh ``*ForCausalLM`` of one TINY_ARCHS entry with seeded random weights."""
    from mlxgraph.exporter.builtins import build_model, make_config

    model_type, overrides = TINY_ARCHS[arch]
    kwargs = {"num_key_value_heads": 2, **_SMALL, **overrides}
    return build_model(make_config(model_type, **kwargs), seed)


@pytest.fixture(scope="session")
def tiny_hf_folder(tmp_path_factory):
    """fn(arch) -> a saved model folder (built once per session per arch)."""
    cache = {}

    def get(arch: str):
        if arch not in cache:
            folder = tmp_path_factory.mktemp(f"hf-{arch}")
            tiny_hf_model(arch).save_pretrained(folder)
            cache[arch] = folder
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory):
    """A byte-level BPE tokenizer.json trained here (the tokenizers library, no torch)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("hf_tok")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(
        ["once upon a time there was a tiny model"] * 20 + ["héllo wörld ✓"] * 5, trainer
    )
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}))
    return folder
