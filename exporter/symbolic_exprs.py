"""Symbolic sizes: torch's SymInts as graph symbols, value slots and SymArith nodes.

Each plain symbol on a user input's shape (the sequence length) becomes a graph Symbol
whose value slot the interpreter fills from the input's shape. Any other symbolic
expression is computed at run time with SymArith nodes (and SymSize for a size with no
symbol of its own); each expression is computed once and its value slot reused.
"""

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

from mlxgraph.exporter.lowering_types import LoweringError
from mlxgraph.schema.enums import SymOp
from mlxgraph.schema.records import Operand

_BINARY = ((sympy.Max, SymOp.max), (sympy.Min, SymOp.min), (FloorDiv, SymOp.floordiv),
           (PythonMod, SymOp.mod), (Mod, SymOp.mod))


def _expr(x):
    """The sympy expression of a SymInt (or an int as a sympy Integer)."""
    if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
        return x.node.expr
    return sympy.sympify(x)


class SymbolTable:
    """Maps sympy expressions to Operands, emitting the nodes that compute them."""

    def __init__(self, writer, range_constraints):
        self.writer = writer
        self.ranges = dict(range_constraints or {})
        self.declared = {}     # sympy.Symbol -> graph symbol name
        self.computed = {}     # sympy expression -> Operand

    def declare_from_inputs(self, inputs) -> None:
        """Declare a graph symbol for every plain symbolic dim of the user inputs.

        The first is named ``T`` (the sequence length); others keep torch's name.
        """
        for _, val in inputs:
            for d in getattr(val, "shape", ()):
                e = _expr(d)
                if isinstance(e, sympy.Symbol) and e not in self.declared:
                    name = "T" if not self.declared else str(e)
                    lo, hi = self._bounds(e)
                    slot = self.writer.add_symbol(name, lo, hi)
                    self.declared[e] = name
                    self.computed[e] = Operand.value(slot)

    def _bounds(self, sym):
        vr = self.ranges.get(sym)
        if vr is None:
            return 0, None
        lo = int(vr.lower) if vr.lower.is_finite else 0
        hi = int(vr.upper) if vr.upper.is_finite else None
        return lo, hi

    def names(self) -> dict:
        """{symbol name: value slot}."""
        return {name: self.computed[sym].index for sym, name in self.declared.items()}

    def dim_entry(self, d):
        """A tensor slot shape entry: int, a declared symbol's name, or None (dynamic)."""
        e = _expr(d)
        if e.is_number:
            return int(e)
        return self.declared.get(e)

    def operand(self, x, ctx, tensor=None, axis=None) -> Operand:
        """A SymInt (or int) as an Operand, emitting the nodes that compute it.

        Args:
            x: the SymInt.
            ctx: the LoweringContext (provenance and slot naming).
            tensor, axis: a tensor slot whose axis has this size, used for a size that
                has no symbol of its own (SymSize).
        Raises:
            LoweringError: an expression this pass cannot compute.
        """
        e = _expr(x)
        if e.is_number:
            if e.is_integer:
                return Operand.literal(int(e))
            return Operand.literal(float(e))
        if e in self.computed:
            return self.computed[e]
        if tensor is not None:
            out = ctx.new_value()
            ctx.emit("SymSize", x=tensor, axis=int(axis), out=out)
            self.computed[e] = Operand.value(out)
            return self.computed[e]
        op = self._compute(e, ctx)
        self.computed[e] = op
        return op

    def _compute(self, e, ctx) -> Operand:
        if isinstance(e, sympy.Add):
            return self._fold(SymOp.add, e.args, ctx)
        if isinstance(e, sympy.Mul):
            return self._fold(SymOp.mul, e.args, ctx)
        for cls, code in _BINARY:
            if isinstance(e, cls):
                return self._fold(code, e.args, ctx)
        raise LoweringError(f"symbolic size {e} cannot be computed at run time")

    def _fold(self, code, args, ctx) -> Operand:
        acc = self.operand(args[0], ctx)
        for a in args[1:]:
            acc = self.arith(code, acc, self.operand(a, ctx), ctx)
        return acc

    def arith(self, code, a: Operand, b: Operand, ctx) -> Operand:
        """Emit ``out = a <code> b`` on runtime ints; returns the value operand."""
        out = ctx.new_value()
        ctx.emit("SymArith", op=int(code), a=a, b=b, out=out)
        return Operand.value(out)


__all__ = ["SymbolTable", "SymOp"]
