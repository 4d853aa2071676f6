"""The trained built-in `tiny-code`: it exports through the Hugging Face folder path, and its
loss on held-out Python (tests/data/tiny_code_heldout.json, files it never trained on)
equals transformers' own within 1e-4 relative, and is far below a random model's.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

import mlxgraph
from mlxgraph.exporter import export
from mlxgraph.exporter.builtins import TRAINED_BUILTINS, build_model, make_config
from mlxgraph.tools.perplexity import graph_nll, nll_sum, windows

FOLDER = TRAINED_BUILTINS["tiny-code"]
SAMPLES_FILE = Path(__file__).with_name("data") / "tiny_code_heldout.json"
SAMPLES = json.loads(SAMPLES_FILE.read_text())["samples"]
TOL = 1e-4


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """(path, export stats) of tiny-code exported by its built-in name, float32, default max T."""
    path = tmp_path_factory.mktemp("tiny-code") / "tiny-code.mlxg"
    return path, export("tiny-code", path)


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()


def test_exports_as_a_hugging_face_folder(graph):
    path, stats = graph
    config = json.loads((FOLDER / "config.json").read_text())
    meta = mlxgraph.load(path).metadata
    # Its own BPE tokenizer is recorded, not the random built-ins' byte one.
    assert meta.tokenizer not in ("", "byte") and meta.vocab_size == config["vocab_size"]
    # The default max T is the model's own context, not 2048 (which it would refuse).
    assert stats["max_seq_len"] == meta.max_context == config["max_position_embeddings"]
    assert meta.eos_token_ids == (0,) and meta.bos_token_id == 0
    assert (FOLDER / "model.safetensors").stat().st_size <= 10 * 2**20


def test_heldout_loss_matches_transformers(graph, hf_model):
    program = mlxgraph.load(graph[0])
    tok = Tokenizer.from_file(str(FOLDER / "tokenizer.json"))
    ours_total = theirs_total = tokens = 0
    for sample in SAMPLES:
        ids = tok.encode(sample["text"]).ids
        assert ids[0] == 0, "a prompt starts with <|endoftext|>, as every training file did"
        for window in windows(ids, program.metadata.max_context):
            ours = graph_nll(program, window)
            with torch.no_grad():
                logits = hf_model(torch.tensor([window[:-1]])).logits[0].numpy()
            theirs = nll_sum(logits, window[1:])
            assert abs(ours - theirs) <= TOL * theirs, sample["path"]
            ours_total, theirs_total, tokens = (
                ours_total + ours,
                theirs_total + theirs,
                tokens + len(window) - 1,
            )
    assert abs(ours_total - theirs_total) <= TOL * theirs_total
    # Trained, not random: uniform over the vocabulary would be log(V) nats per token.
    assert ours_total / tokens < 0.6 * math.log(program.metadata.vocab_size)


def test_default_max_seq_len_follows_a_short_context(tmp_path):
    model = build_model(
        make_config(
            "llama",
            num_hidden_layers=1,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=24,
        )
    )
    stats = export(model, tmp_path / "short.mlxg")
    assert stats["max_seq_len"] == 24


def test_windows_predict_every_token_once():
    ids = list(range(10))
    wins = windows(ids, 4)
    assert wins == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [8, 9]]
    assert [t for w in wins for t in w[1:]] == ids[1:]
    with pytest.raises(ValueError):
        windows(ids, 0)


def test_nll_sum_is_cross_entropy():
    logits = np.random.default_rng(0).normal(size=(5, 7)).astype(np.float32)
    targets = [1, 0, 6, 3, 3]
    want = torch.nn.functional.cross_entropy(
        torch.tensor(logits, dtype=torch.float64), torch.tensor(targets), reduction="sum"
    )
    assert nll_sum(logits, targets) == pytest.approx(float(want), rel=1e-12)
