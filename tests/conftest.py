"""Shared fixtures: tiny Hugging Face model folders (config + safetensors, random weights).

``tiny_hf_folder(arch)`` returns a folder saved once per test session, for any test that
wants a real model folder on disk. The configs are small (2-3 layers, hidden 64, the 256
byte vocabulary) so exporting one takes a few seconds. torch runs one thread per test process.
"""

import json
import os
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A command given a model exports it into the graph cache: never the user's own.
os.environ.setdefault("MLXGRAPH_GRAPH_CACHE", tempfile.mkdtemp(prefix="mlxgraph-test-graphs-"))
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
    # Falcon-7B's layout (one K/V head, attention and MLP in parallel off one LayerNorm):
    # through transformers' AttentionInterface since 5.25, so it exports, and must be exact.
    "falcon": (
        "falcon",
        {"num_hidden_layers": 2, "multi_query": True, "new_decoder_architecture": False,
         "parallel_attn": True},
    ),
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


# The longest modules (CPU seconds of `make test`, measured with --durations), longest first.
# `make test` hands whole modules to the xdist workers as they free up (--dist loadscope, in
# collection order: --no-loadscope-reorder): a long module handed out last would keep one
# worker busy while the other idles, so these go out first and the short ones fill in.
# Modules sharing a run-wide export (tests/run_cache.py) are spread apart, so one worker
# rarely waits for the other to finish building it.
LONGEST_FIRST = (
    "test_export_decompositions.py",
    "test_export_breadth.py",
    "test_export_checks.py",
    "test_export_reproducible.py",
    "test_exporter_parity.py",
    "test_docs.py",
    "test_exporter_cli.py",
    "test_fuzz_verifier.py",
    "test_kv_cache.py",
    "test_exporter_moe.py",
    "test_export_loads.py",
    "test_refusals.py",
    "test_fusions.py",
    "test_pipeline.py",
    "test_exporter_lowering.py",
    "test_first_hour.py",
    "test_diff.py",
    "test_exporter_attention_features.py",
    "test_tiny_code.py",
    "test_generate.py",
    "test_chat.py",
    "test_quantized.py",
    "test_serve_limits.py",
    "test_serve.py",
    "test_file_safety.py",
)


def pytest_collection_modifyitems(items):
    """Run LONGEST_FIRST's modules first, in its order (the rest keep collection order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
