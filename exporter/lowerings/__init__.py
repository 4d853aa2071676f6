"""Lowerings: one small registered function per ATen op target.

A lowering is called as ``fn(ctx, node)`` with the :class:`~mlxgraph.exporter.lowering_pass.
LoweringContext` and the torch.fx node, after run_decompositions. It emits zero or more
graph nodes through ``ctx`` and returns what the fx node becomes:

- a :class:`~mlxgraph.exporter.lowering_types.Slot` (a tensor slot),
- an :class:`~mlxgraph.schema.records.Operand` (a runtime int or a literal, for SymInts),
- a list of those (ops with several outputs, read through ``operator.getitem``),
- ``None`` (the node has no value, e.g. an assertion).

A lowering that meets an argument it cannot express raises :class:`LoweringError`; the
pass collects every such error and every op without a lowering and reports them together.
"""

from mlxgraph.exporter.lowering_types import LoweringError
from mlxgraph.schema.registry import LazyRegistry

OP_MODULES = ("elementwise", "reductions", "linalg", "layout", "creation", "symbolic", "attention",
              "fused", "normalization", "selection", "composite", "state")
LOWERINGS = LazyRegistry(__name__, OP_MODULES)


def register(*targets):
    """Decorator: register ``fn`` as the lowering of each target (an OpOverload or callable)."""

    def wrap(fn):
        for t in targets:
            LOWERINGS.add(t, fn)
        return fn

    return wrap


def lowerings() -> dict:
    """Every registered lowering by target (imports the op modules on first use)."""
    return LOWERINGS.table()


__all__ = ["LOWERINGS", "LoweringError", "register", "lowerings"]
