"""run_decompositions, with aten.linear and aten.silu left whole where the fusions would
rebuild them.

The default table decomposes each aten.linear (a CompositeImplicitAutograd op) through
aten.matmul's Python decomposition, symbolic shape reasoning at every step, into a view,
permute(W), mm or addmm and a view back; fusions.fuse_linear then turns those four nodes
back into the one ``aten.linear(x, W, b)`` they came from. On the small Llama of
benchmarks/quantize_export_bench.py that round trip is a quarter of run_decompositions.
It is skipped where it provably ends in the node it started from:

- the weight is a 2-D constant (parameter, buffer or constant tensor): fuse_linear
  rebuilds only ``permute(W, [1, 0])`` of a constant;
- the bias is absent or 1-D: fuse_linear rebuilds addmm only with a 1-D bias;
- the input has at least 3 dims and its strides are its contiguous strides whatever the
  symbols' values: aten.linear then flattens it by a view (``_flatten_nd_linear`` with a
  bias, matmul's fold without), and fuse_linear reads through exactly that view back to
  the input. A 2-D input (a router over flattened tokens) is left to the default table,
  since fuse_linear may fold the model's own views around it; so is anything
  non-contiguous (matmul would copy it, or not fold it) or 1-D.

aten.silu likewise, of a float32 input: its decomposition is ``x * sigmoid(x)``, which
fusions.fuse_silu turns back into ``aten.silu(x)`` (17 ms a call on the small Llama,
decomposed twice). A half-precision input is upcast to float32 around it first, so the
fused node would read the upcast: left to the default table.

A traced program that mutates anything in place goes to the default table whole: there an
in-place op on a linear's result (Gemma 3n's ``*=``) writes through the view its
decomposition returns, and functionalization replays that view (two more reshapes than
the kept linear needs), which a view of the input mutated later could do too.

Every linear and SiLU of the traced program must qualify, or the default table decomposes
it all. The conditions are checked again on the decomposed program (its values are what
decided what the ops would have become), which goes back to the default table if any
fails. A qualifying program whose other ops need only local rewrites skips the re-trace
altogether (exporter/direct_decompositions.py: its values are the traced ones, so the
conditions hold as checked).
The graph is then the default table's node for node, constant for constant; only fx's
node names differ, since the nodes the round trip made no longer take numbers
(tests/test_export_decompositions.py exports the tiny models both ways).
"""

import torch
from torch.export import default_decompositions

from mlxgraph.exporter.direct_decompositions import (
    contiguous_for_every_value,
    decompose_directly,
)

_LINEAR = torch.ops.aten.linear.default
_SILU = torch.ops.aten.silu.default
_CONSTANT_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")


def _tensor(arg):
    """The traced tensor ``arg`` stands for, or None (not a node, or not a tensor)."""
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _mutates(n) -> bool:
    return (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and n.target._schema.is_mutable)


def _linear_rebuilt(n, constants) -> bool:
    """Whether fuse_linear would rebuild this aten.linear as it is."""
    x, w = _tensor(n.args[0]), _tensor(n.args[1])
    bias = n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")
    constant = w is not None and n.args[1].op == "placeholder" and n.args[1].name in constants
    return (constant and w.ndim == 2
            and (bias is None or (_tensor(bias) is not None and _tensor(bias).ndim == 1))
            and x is not None and x.ndim >= 3 and contiguous_for_every_value(x))


def _silu_rebuilt(n) -> bool:
    """Whether fuse_silu would rebuild this aten.silu as it is."""
    x = _tensor(n.args[0])
    return x is not None and x.dtype == torch.float32


def ops_kept_whole(ep) -> bool:
    """Whether ``ep`` mutates nothing and the fusions would rebuild every aten.linear and
    aten.silu in it as it is."""
    constants = {s.arg.name for s in ep.graph_signature.input_specs
                 if s.kind.name in _CONSTANT_KINDS}
    for n in ep.graph.nodes:
        if _mutates(n):
            return False
        if n.op != "call_function":
            continue
        if n.target is _LINEAR and not _linear_rebuilt(n, constants):
            return False
        if n.target is _SILU and not _silu_rebuilt(n):
            return False
    return True


def decompose_to_core_aten(ep):
    """``ep`` decomposed to core ATen, its linears and SiLUs whole where that changes
    nothing after fusion (the module docstring); ``ep`` itself, rewritten in place, where
    no re-trace is needed (exporter/direct_decompositions.py)."""
    if ops_kept_whole(ep):
        if decompose_directly(ep):
            return ep
        table = default_decompositions()
        del table[_LINEAR], table[_SILU]
        decomposed = ep.run_decompositions(table)
        if ops_kept_whole(decomposed):
            return decomposed
    return ep.run_decompositions()


__all__ = ["decompose_to_core_aten", "ops_kept_whole"]
