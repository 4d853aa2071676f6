"""Fusions cannot break silently: each pattern is tested on the transformers module it is
written for, and the op histogram of every built-in export is pinned.

A fusion that stops matching leaves a graph that still runs and is still right, only
larger and slower, so parity tests never notice. Here each pattern must fire on the real
Hugging Face module (Llama's MLP for linear + silu, Llama's and Gemma's RMSNorm, the
rotate-half RoPE of Llama's attention) and leave none of the ops it replaces; and each
built-in model's export must produce exactly its recorded op histogram.
"""

from collections import Counter

import pytest
import torch
from lowering_helpers import V, check_runs_like_torch, lower_module
from tool_helpers import exported_tiny_llama
from torch import nn

from mlxgraph.exporter import export
from mlxgraph.exporter.builtins import BUILTINS, make_config
from mlxgraph.schema.reader import open_graph
from mlxgraph.schema.spec import op_spec

HIDDEN = 16


class Around(nn.Module):
    """``forward(tokens, positions)``: an embedding, then the module under test."""

    def __init__(self, inner, call=None):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(V, HIDDEN)
        self.inner = inner
        self.call = call or (lambda m, h, positions: m(h))

    def forward(self, tokens, positions):
        return self.call(self.inner, self.embed(tokens), positions)


def _ops(writer) -> dict:
    out = {}
    for n in writer.nodes:
        name = op_spec(n.op).short_name
        out[name] = out.get(name, 0) + 1
    return out


def _config(model_type: str, **kw):
    return make_config(
        model_type,
        hidden_size=HIDDEN,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        **kw,
    )


def _seeded(module):
    torch.manual_seed(1)
    for p in module.parameters():
        nn.init.normal_(p, 0.0, 0.5)
    return module.eval()


def test_linear_and_silu_fuse_on_llamas_mlp(tmp_path):
    from transformers.models.llama.modeling_llama import LlamaMLP

    module = Around(_seeded(LlamaMLP(_config("llama")))).eval()
    ops = _ops(lower_module(module, tmp_path / "mlp.mlxg"))
    assert ops.get("Linear") == 3 and ops.get("Silu") == 1, ops
    assert not {"Matmul", "Addmm", "Permute", "Reshape", "Sigmoid"} & set(ops), ops
    check_runs_like_torch(module, tmp_path / "mlp2.mlxg", tol=1e-5)


@pytest.mark.parametrize(
    "model_type, cls, offset",
    [
        ("llama", "transformers.models.llama.modeling_llama.LlamaRMSNorm", 0.0),
        ("gemma3_text", "transformers.models.gemma3.modeling_gemma3.Gemma3RMSNorm", 1.0),
    ],
)
def test_rms_norm_fuses_on_the_models_own_norm(tmp_path, model_type, cls, offset):
    import importlib

    module_name, name = cls.rsplit(".", 1)
    norm_cls = getattr(importlib.import_module(module_name), name)
    module = Around(_seeded(norm_cls(HIDDEN, eps=1e-6))).eval()
    writer = lower_module(module, tmp_path / "norm.mlxg")
    ops = _ops(writer)
    assert ops == {"Embedding": 1, "RmsNorm": 1}, ops
    norm = next(n for n in writer.nodes if n.op == "RmsNormNode")
    assert norm.fields["weight_offset"] == offset
    check_runs_like_torch(module, tmp_path / "norm2.mlxg", tol=1e-5)


def test_rope_fuses_on_llamas_rotary_embedding_and_apply(tmp_path):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = _config("llama")
    rotary = LlamaRotaryEmbedding(config).eval()

    def call(m, h, positions):
        q = h.view(1, -1, 2, 8).transpose(1, 2)  # [1, heads, T, head_dim]
        cos, sin = m(q, positions.unsqueeze(0))
        q_rot, k_rot = apply_rotary_pos_emb(q, q * 0.5, cos, sin)
        return (q_rot + k_rot).transpose(1, 2).reshape(1, -1, HIDDEN)

    module = Around(rotary, call).eval()
    ops = _ops(lower_module(module, tmp_path / "rope.mlxg"))
    # One Concat remains: the rotary embedding's own cat((freqs, freqs)); rotate_half's
    # cat(-x2, x1) and its Neg are gone into the Rope nodes.
    assert ops.get("Rope") == 2 and ops.get("Concat") == 1 and "Neg" not in ops, ops
    check_runs_like_torch(module, tmp_path / "rope2.mlxg", tol=1e-5)


# name -> the op histogram of `export(name)` (float32, max_seq_len 64). A change here is a
# change of what the exporter emits: check it is intended (e.g. a fusion that stopped
# matching grows the graph) and update the record.
BUILTIN_OPS = {
    "tiny-llama": {"Linear": 29, "Reshape": 17, "Permute": 16, "RmsNorm": 9, "Add": 8, "Rope": 8,
        "Mul": 7, "Silu": 4, "Unsqueeze": 4, "UpdateAndAttend": 4, "Cast": 1, "Concat": 1,
        "Cos": 1, "Embedding": 1, "Sin": 1},
    "tiny-qwen2": {"Linear": 22, "Reshape": 13, "Permute": 12, "RmsNorm": 7, "Add": 6, "Mul": 6,
        "Rope": 6, "Unsqueeze": 4, "Silu": 3, "UpdateAndAttend": 3, "Cast": 1, "Concat": 1,
        "Cos": 1, "Embedding": 1, "Sin": 1},
    "tiny-mistral": {"Linear": 29, "Reshape": 17, "Permute": 16, "RmsNorm": 9, "Add": 8,
        "Rope": 8, "Mul": 7, "Silu": 4, "Unsqueeze": 4, "UpdateAndAttend": 4, "Cast": 1,
        "Concat": 1, "Cos": 1, "Embedding": 1, "Sin": 1},
    "tiny-gemma3": {"Linear": 29, "RmsNorm": 25, "Reshape": 17, "Permute": 16, "Mul": 11,
        "Add": 8, "Rope": 8, "Unsqueeze": 6, "Gelu": 4, "UpdateAndAttend": 4, "Concat": 2,
        "Cos": 2, "Sin": 2, "Cast": 1, "Embedding": 1},
    "tiny-phi3": {"Slice": 15, "Linear": 13, "Reshape": 13, "Permute": 12, "Concat": 7,
        "RmsNorm": 7, "Add": 6, "Mul": 6, "Rope": 6, "Unsqueeze": 4, "Silu": 3, "Split": 3,
        "UpdateAndAttend": 3, "Cast": 1, "Cos": 1, "Embedding": 1, "Sin": 1},
}
_FAST = ("tiny-llama", "tiny-gemma3")  # the others run with -m slow


@pytest.mark.parametrize(
    "name", [n if n in _FAST else pytest.param(n, marks=pytest.mark.slow) for n in BUILTINS]
)
def test_builtin_export_op_histogram(name, tmp_path_factory):
    if name == "tiny-llama":  # exported once per run for several test modules
        path = exported_tiny_llama(tmp_path_factory, ("float32",))["float32"]
    else:
        path = tmp_path_factory.mktemp(name) / f"{name}.mlxg"
        export(name, path, max_seq_len=64)
    ops = Counter(n.op[: -len("Node")] for n in open_graph(path).nodes)
    assert dict(ops) == BUILTIN_OPS[name]
    layers = make_config(BUILTINS[name][0], **BUILTINS[name][1]).num_hidden_layers
    assert ops["UpdateAndAttend"] == layers and ops["Rope"] == 2 * layers
    # Per layer: input and post-attention norms (Gemma-3: also pre/post feed-forward and q/k
    # norms), plus the final norm.
    assert ops["RmsNorm"] == (6 if name == "tiny-gemma3" else 2) * layers + 1
