"""The lowering pass on small modules: each lowered graph runs in the interpreter and is
compared with torch's own output, for several sequence lengths from one export."""

import numpy as np
import pytest
import torch
from lowering_helpers import D, V, check_runs_like_torch, lower_module
from torch import nn

from mlxgraph.exporter.lowering_pass import UnsupportedOpsError
from mlxgraph.exporter.lowerings import lowerings
from mlxgraph.schema.reader import open_graph


class Zoo(nn.Module):
    """Many ATen ops a decoder's graph holds after decompositions, on [1, T, D] features."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(V, D)
        self.proj = nn.Linear(D, D)
        self.proj2 = nn.Linear(D, 2 * D, bias=False)
        self.mat = nn.Parameter(torch.randn(D, D))

    def forward(self, tokens, positions):
        x = self.emb(tokens)                                           # [1, T, D]
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        p = positions.float()[None, :, None]                           # [1, T, 1]
        a, b = self.proj2(x).split([D, D], dim=-1)
        feats = [
            self.proj(x),
            torch.nn.functional.silu(a) * b,
            torch.where(x > 0, x, 0.1 * x),
            torch.softmax(x, dim=-1),
            torch.log_softmax(x, dim=-1),
            torch.nn.functional.gelu(x, approximate="tanh"),
            torch.nn.functional.gelu(x),
            torch.sigmoid(x) + torch.tanh(x) - torch.exp(-x.abs()),
            torch.clamp(x, -0.5, 0.5),
            torch.relu(x) / (1 + p),
            (x @ self.mat).transpose(1, 2).transpose(1, 2),
            torch.cat([x[..., -3:], x[..., :-3]], dim=-1),
            torch.cos(p) * torch.sin(x),
            x.amax(-1, keepdim=True).expand(1, x.shape[1], D),
            x.sum(-1, keepdim=True) + p,
            torch.remainder(p, 3.0).expand(-1, -1, D),
            torch.div(p, 2, rounding_mode="floor").expand(-1, -1, D),
            torch.maximum(x, -x) + torch.minimum(x, torch.zeros_like(x)),
            (x[:, -1:] + x).clone().contiguous().detach(),
            torch.ones(1, x.shape[1], D) * torch.arange(x.shape[1]).float()[None, :, None],
            torch.expm1(x * 1e-3) + torch.log1p(x.abs() * 1e-3),       # format 1.3
            torch.erfinv(torch.tanh(x) * 0.9),
        ]
        return torch.cat(feats, dim=-1)


def test_op_zoo_runs_like_torch_for_several_lengths(tmp_path):
    check_runs_like_torch(Zoo().eval(), tmp_path / "zoo.mlxg")


class Windowed(nn.Module):
    """Symbolic slicing and selection: the last tokens of a dynamic axis."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)

    def forward(self, tokens, positions):
        x = self.emb(tokens)
        last = x[:, -1:, :].expand(-1, x.shape[1], -1)
        first = x[:, 0][:, None, :].expand(-1, x.shape[1], -1)
        n = x.shape[1]
        flat = x.reshape(1, n * D).reshape(1, n, D)
        # Sizes that are expressions of T: SymArith nodes (n * 2 + 3, n // 2) and symbolic slices.
        ramp = (torch.arange(n * 2 + 3)[3:][::2] + torch.ones(n + 1)[1:] * (n // 2)).float()
        down = torch.arange(-n, 0).float()                  # a negated size: SymArith neg
        return torch.cat([last, first, flat, x + ramp[None, :, None], x * down[None, :, None]], -1)


def test_symbolic_slices_and_reshapes(tmp_path):
    writer = lower_module(Windowed().eval(), tmp_path / "win.mlxg")
    assert sum(n.op == "SymArithNode" for n in writer.nodes) >= 3
    check_runs_like_torch(Windowed().eval(), tmp_path / "win.mlxg", lengths=(1, 3, 16))


class LayerNorms(nn.Module):
    """nn.LayerNorm with weight and bias, with weight only, and without either, in ``dtype``."""

    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(V, D)
        self.full, self.no_bias, self.plain = (
            nn.LayerNorm(D),
            nn.LayerNorm(D, bias=False),
            nn.LayerNorm(D, elementwise_affine=False),
        )
        for p in self.parameters():
            nn.init.normal_(p)  # not the identity init, so weight and bias count
        self.dtype = dtype
        for norm in (self.full, self.no_bias, self.plain):
            norm.to(dtype)

    def forward(self, tokens, positions):
        x = (self.emb(tokens) * 3 + 1).to(self.dtype)                # a mean and scale to remove
        return torch.cat([self.full(x), self.no_bias(x), self.plain(x)], -1).float()


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_layer_norm(tmp_path, dtype, tol):
    writer = lower_module(LayerNorms(dtype).eval(), tmp_path / "ln.mlxg")
    ops = [n.op for n in writer.nodes]
    assert ops.count("LayerNormNode") == 3 and "MeanNode" not in ops
    # float16 is normalized in float32 like torch's CPU kernel: only the output is rounded.
    check_runs_like_torch(LayerNorms(dtype).eval(), tmp_path / "ln2.mlxg", lengths=(1, 5), tol=tol)


class Flat2D(nn.Module):
    """A linear on a 2-D input: decomposes to addmm/mm with no flattening views around it."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.proj, self.head = nn.Linear(D, D), nn.Linear(D, V, bias=False)

    def forward(self, tokens, positions):
        return self.head(self.proj(self.emb(tokens)[0]))


def test_linear_on_a_matrix_is_one_linear_node(tmp_path):
    writer = lower_module(Flat2D().eval(), tmp_path / "flat.mlxg")
    assert [n.op for n in writer.nodes] == [
        "EmbeddingNode",
        "SelectNode",
        "LinearNode",
        "LinearNode",
    ]
    check_runs_like_torch(Flat2D().eval(), tmp_path / "flat2.mlxg", lengths=(1, 4))


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)

    def forward(self, tokens, positions):
        x = self.emb(tokens)
        y = torch.cumsum(x, dim=-1)          # no lowering
        z = torch.sort(x, dim=-1).values     # no lowering either
        return y + z + torch.special.i0(x)


def test_unsupported_ops_are_all_listed_with_their_source(tmp_path):
    with pytest.raises(UnsupportedOpsError) as info:
        lower_module(Unsupported(), tmp_path / "bad.mlxg")
    message = str(info.value)
    for target in ("aten.cumsum.default", "aten.sort.default", "aten.i0.default"):
        assert target in message
    assert "test_exporter_lowering.py" in message and "in forward" in message
    assert len({p.target for p in info.value.problems}) == 3


def test_a_failing_lowering_is_reported_like_an_unsupported_op(tmp_path, monkeypatch):
    def broken(ctx, node):
        raise KeyError("no such field")

    lowerings()  # load the table first, so the patch is not overwritten by the first load
    monkeypatch.setitem(lowerings(), torch.ops.aten.cumsum.default, broken)
    with pytest.raises(UnsupportedOpsError) as info:
        lower_module(Unsupported(), tmp_path / "bad.mlxg")
    (problem,) = [p for p in info.value.problems if p.target == "aten.cumsum.default"]
    assert (
        problem.reason == "internal error in its lowering, please report: KeyError: 'no such field'"
    )
    assert "test_exporter_lowering.py" in problem.location


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight                    # tied: one parameter
        self.copy = nn.Parameter(self.emb.weight.detach().clone())  # same bytes, other parameter

    def forward(self, tokens, positions):
        x = self.emb(tokens)
        return self.head(x) + x @ self.copy.T


def test_tied_and_identical_weights_are_stored_once(tmp_path):
    writer = lower_module(Tied(), tmp_path / "tied.mlxg")
    assert len(writer.constants) == 1
    check_runs_like_torch(Tied().eval(), tmp_path / "tied2.mlxg", lengths=(2,))


class Cast(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D).to(torch.bfloat16)

    def forward(self, tokens, positions):
        return self.emb(tokens).float()


def test_bfloat16_constants_keep_their_bit_pattern(tmp_path):
    module = Cast()
    lower_module(module, tmp_path / "bf16.mlxg")
    graph = open_graph(tmp_path / "bf16.mlxg")
    (const,) = graph.constants
    assert graph.tensors[const.tensor].dtype == "bfloat16"
    bits = module.emb.weight.detach().view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(graph.constant_array(0), bits)
    check_runs_like_torch(module, tmp_path / "bf16b.mlxg", lengths=(3,))


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.block = nn.Sequential(nn.Linear(D, D))

    def forward(self, tokens, positions):
        return self.block(self.emb(tokens).clone().contiguous())


def test_provenance_aliases_and_symbols(tmp_path):
    writer = lower_module(Nested(), tmp_path / "nested.mlxg")
    ops = [n.op for n in writer.nodes]
    assert ops == ["EmbeddingNode", "LinearNode"]           # clone/contiguous: no nodes
    linear = writer.nodes[1]
    assert linear.provenance.module_path == "block.0"
    assert linear.provenance.target == "aten.linear.default"   # the fused view-addmm-view
    graph = open_graph(tmp_path / "nested.mlxg")
    (sym,) = graph.symbols
    assert (sym.name, sym.min, sym.max) == ("T", 1, 16)
    assert set(graph.inputs) == {"tokens", "positions"}
    assert graph.tensors[graph.inputs["tokens"]].dtype == "int32"
