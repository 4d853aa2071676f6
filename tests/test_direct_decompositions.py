"""exporter/direct_decompositions.py: each local rewrite gives the default table's graph,
and a program any rewrite does not cover is left, untouched, to the re-trace.

Small modules are traced twice; one program is rewritten directly, the other goes through
``run_decompositions()``, and the two graphs must agree node for node (targets, wiring,
arguments, values' shapes, strides and dtypes) but for fx's node names.
(tests/test_export_decompositions.py does the same for every tiny model, as files.)
"""

import warnings

import pytest
import torch

from mlxgraph.exporter.direct_decompositions import decompose_directly
from mlxgraph.exporter.fusions import drop_dtype_assertions


class Casts(torch.nn.Module):
    """to (same dtype, another dtype, a buffer to its own device and dtype), transposes,
    a reshape with -1, contiguous of a transposed and of a contiguous tensor."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.arange(4, dtype=torch.float32), persistent=False)

    def forward(self, x, ids):
        y = x.to(torch.float32) * self.scale.to(x.device, torch.float32)
        c = y.transpose(1, 2).contiguous().transpose(1, 2)
        r = y.reshape(1, -1, 4)
        d = y.transpose(-1, -2).transpose(-2, -1).contiguous()
        return c + r + d + ids.unsqueeze(-1).to(torch.float32)


class ReshapeOfTranspose(torch.nn.Module):
    """reshape of a non-contiguous tensor: a copy, which is the re-trace's to write."""

    def forward(self, x, ids):
        return x.transpose(1, 2).reshape(1, -1) + ids.sum()


class InPlace(torch.nn.Module):
    """an in-place op: functionalization is the re-trace's."""

    def forward(self, x, ids):
        y = x * 2
        y.add_(1)
        return y + ids.sum()


class SizeArithmetic(torch.nn.Module):
    """Python arithmetic on the symbolic size: the re-trace records it again."""

    def forward(self, x, ids):
        return x.view(x.shape[1] * 4) + ids.sum()


def _program(module):
    x = torch.randn(1, 3, 4)
    ids = torch.arange(3, dtype=torch.int32)
    t = torch.export.Dim("T", min=1, max=64)
    ep = torch.export.export(module, (x, ids), dynamic_shapes={"x": {1: t}, "ids": {0: t}})
    drop_dtype_assertions(ep.graph)
    ep.graph_module.recompile()
    return ep


def _canonical(ep) -> list:
    """The graph without fx's names: each node's op, target, arguments (nodes as their
    index) and value (shape, strides, dtype)."""
    index = {}
    out = []
    for n in ep.graph.nodes:
        index[n] = len(out)
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: f"#{index[a]}")
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            val = (str(tuple(val.shape)), str(tuple(val.stride())), val.dtype)
        out.append((n.op, str(n.target) if n.op != "placeholder" else n.name, str(args),
                    str(val)))
    return out


def _default(ep):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        return ep.run_decompositions()


def test_the_rewrites_give_the_default_tables_graph():
    ep = _program(Casts())
    assert decompose_directly(ep)
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"aten._to_copy.default", "aten.permute.default", "aten.view.default",
            "aten.clone.default"} <= targets
    assert not targets & {"aten.to.dtype", "aten.to.device", "aten.transpose.int",
                          "aten.reshape.default", "aten.contiguous.default"}
    assert _canonical(ep) == _canonical(_default(_program(Casts())))


@pytest.mark.parametrize("module", [ReshapeOfTranspose, InPlace, SizeArithmetic])
def test_anything_else_is_left_to_the_retrace(module):
    ep = _program(module())
    before = _canonical(ep)
    assert not decompose_directly(ep)
    assert _canonical(ep) == before
