"""Export keeps only files `load` accepts (issue 31, item 5), on real models.

The verifier makes every check the loader makes (tests/test_verify_load_parity.py) and
export verifies a file before keeping it; here every built-in, and tiny random-config
models of the architectures the README says export without a parity suite of their own,
go the whole way: export, ``mlxgraph.load``, one prefill step against transformers' eager
forward (the same seeded weights). Models the export refuses are tests/test_refusals.py's.
"""

import numpy as np
import pytest
import torch

import mlxgraph
from mlxgraph.exporter import export
from mlxgraph.exporter.builtins import BUILTINS, TRAINED_BUILTINS, build_model, make_config

PROMPT, MAX_T, TOL = 7, 16, 1e-4
_SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256)
# model type -> config overrides: README's "export and run too" list, beside the parity suites'.
RANDOM_CONFIGS = {
    "gpt2": dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64),
    "gpt_neox": dict(_SMALL, rotary_pct=0.5),
    "phi": dict(_SMALL, partial_rotary_factor=0.5),
    "starcoder2": dict(_SMALL, sliding_window=None),
    "olmo": dict(_SMALL),
    "stablelm": dict(_SMALL, partial_rotary_factor=0.25),
    "qwen2_moe": dict(_SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64),
    "olmoe": dict(_SMALL, num_experts=4, num_experts_per_tok=2),
    "granitemoe": dict(_SMALL, num_local_experts=4, num_experts_per_tok=2),
    # the metadata's vocabulary is the embedding's rows: Fuyu's sizes live in its text
    # config, Moshi's embedding has one row more than its config's vocab_size
    "fuyu": dict(_SMALL, head_dim=16, max_position_embeddings=64),
    "moshi": dict(_SMALL, head_dim=16, max_position_embeddings=64),
}


def _first_step(path, prompt) -> np.ndarray:
    program = mlxgraph.load(path)
    logits = program.session().step([prompt], range(len(prompt)))
    return np.array(logits)[0]


@pytest.mark.parametrize("name", [*TRAINED_BUILTINS, *BUILTINS])
def test_every_builtin_exports_and_loads(name, tmp_path):
    path = tmp_path / f"{name}.mlxg"
    stats = export(name, path, max_seq_len=MAX_T)
    logits = _first_step(path, [2, *b"def f"][:PROMPT])
    assert logits.shape[1] == mlxgraph.load(path).metadata.vocab_size
    assert np.isfinite(logits).all() and stats["ops"]["UpdateAndAttend"] >= 1


@pytest.mark.parametrize("model_type", list(RANDOM_CONFIGS))
def test_random_config_models_export_load_and_match(model_type, tmp_path):
    config = make_config(model_type, **RANDOM_CONFIGS[model_type])
    path = tmp_path / f"{model_type}.mlxg"
    export(build_model(config), path, max_seq_len=MAX_T)
    prompt = torch.randint(4, 256, (PROMPT,), generator=torch.Generator().manual_seed(3)).tolist()
    hf = build_model(config)
    hf.set_attn_implementation("eager")
    with torch.no_grad():
        want = hf(torch.tensor([prompt])).logits[0].numpy()
    got = _first_step(path, prompt)
    assert np.abs(got - want).max() <= TOL * np.abs(want).max()
