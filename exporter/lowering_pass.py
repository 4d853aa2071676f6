"""The lowering pass: an exported program (after run_decompositions) to GraphWriter nodes.

It walks the fx graph once, in order, and calls the lowering registered for each node's
target (exporter/lowerings). Parameters and buffers become constants; user inputs become
graph inputs with symbolic dims; the program's output becomes the graph output. Every
op without a lowering, and every lowering that cannot express its node, is collected and
reported at once (:class:`UnsupportedOpsError`), each with its source location.
"""

import numpy as np
import torch
from torch.export.graph_signature import InputKind

from mlxgraph.exporter.diagnostics import Problem, UnsupportedOpsError, module_path, source_location
from mlxgraph.exporter.fusions import run_fusions
from mlxgraph.exporter.lowering_types import POISON, LoweringError, Slot, torch_dtype_name
from mlxgraph.exporter.lowerings import lowerings
from mlxgraph.exporter.symbolic_exprs import SymbolTable
from mlxgraph.schema.records import Operand, Provenance

_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


class LoweringContext:
    """What a lowering sees: the node being lowered, slots of its inputs, and the writer."""

    def __init__(self, writer, symbols: SymbolTable, strip_prefix: str = ""):
        self.writer = writer
        self.strip_prefix = strip_prefix
        self.symbols = symbols
        self.env = {}
        self.node = None

    # ------------------------------------------------------------------ reading inputs
    def lookup(self, arg):
        """The lowered value of an fx node argument (Slot, Operand, list or None)."""
        return self.env[arg] if isinstance(arg, torch.fx.Node) else arg

    def slot(self, arg) -> int:
        """The tensor slot of a tensor argument.

        Raises:
            LoweringError: the argument is not a tensor.
        """
        v = self.lookup(arg)
        if not isinstance(v, Slot):
            raise LoweringError(f"expected a tensor argument, got {v!r}")
        return v.index

    def operand(self, arg) -> Operand:
        """A tensor, runtime int or literal argument as an Operand."""
        v = self.lookup(arg)
        if isinstance(v, Slot):
            return Operand.tensor(v.index)
        if isinstance(v, Operand):
            return v
        if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
            return self.symbols.operand(v, self)
        if isinstance(v, bool | int | float):
            return Operand.literal(v)
        raise LoweringError(f"cannot use {v!r} as an operand")

    def operands(self, args) -> list:
        """A list of int-like arguments (a shape) as Operands."""
        return [self.operand(a) for a in args]

    @staticmethod
    def val(arg):
        """The traced value (FakeTensor, SymInt, ...) of an fx node argument."""
        return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg

    def shape(self, arg) -> tuple:
        """The traced shape of a tensor argument (ints and SymInts)."""
        return tuple(self.val(arg).shape)

    def dim_operand(self, arg, axis: int) -> Operand:
        """The size of ``axis`` of a tensor argument: a literal when static, else a runtime int."""
        size = self.shape(arg)[axis]
        if isinstance(size, int):
            return Operand.literal(size)
        return self.symbols.operand(size, self, tensor=self.slot(arg), axis=axis)

    # ------------------------------------------------------------------ writing
    def provenance(self) -> Provenance:
        """Provenance of the node being lowered."""
        n = self.node
        if n is None:
            return Provenance()
        return Provenance(n.name, module_path(n, self.strip_prefix), _target_name(n.target))

    def new_tensor(self, val=None, name=None) -> int:
        """Declare the output slot of the current node (dtype and shape from its traced value)."""
        val = self.val(self.node) if val is None else val
        name = name or self.node.name
        shape = [self.symbols.dim_entry(d) for d in val.shape]
        return self.writer.add_tensor(name, torch_dtype_name(val.dtype), shape)

    def emit(self, op_name: str, **fields):
        """Append a node with the current node's provenance.

        Raises:
            KeyError: unknown op or field.
        """
        return self.writer.add_node(op_name, self.provenance(), **fields)

    def emit_out(self, op_name: str, val=None, name=None, **fields) -> Slot:
        """Declare an output slot, emit ``op`` writing it into field ``out``; returns the Slot."""
        out = self.new_tensor(val, name)
        self.emit(op_name, out=out, **fields)
        return Slot(out)

    def new_value(self, name=None) -> int:
        """Declare a value slot (runtime int) named after the current node."""
        return self.writer.add_value(name or self.node.name)


def _target_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def _constant_array(tensor: torch.Tensor):
    """(numpy array, dtype name) of a constant; bfloat16 as its uint16 bit pattern."""
    t = tensor.detach().cpu().contiguous()
    name = torch_dtype_name(t.dtype)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), name
    return t.numpy(), name


def lower_program(
    ep, writer, output_names=("logits",), strip_prefix: str = "model.", fuse: bool = True
) -> dict:
    """Lower an exported program into ``writer``.

    Args:
        ep: a torch.export.ExportedProgram, already run through run_decompositions().
        writer: the GraphWriter to fill.
        output_names: graph names of the program's outputs, in order.
        strip_prefix: dropped from constant and module names (the adapter's attribute).
        fuse: first rewrite known patterns into fused nodes (exporter/fusions.py; changes ep).
    Returns:
        {'symbols': {name: value slot}, 'fusions': {pattern: count}}.
    Raises:
        UnsupportedOpsError: ops without a lowering, or that a lowering cannot express.
        ValueError: the program has another number of outputs than ``output_names``.
    """
    fusions = run_fusions(ep) if fuse else {}
    symbols = SymbolTable(writer, ep.range_constraints)
    ctx = LoweringContext(writer, symbols, strip_prefix)
    sig = {s.arg.name: s for s in ep.graph_signature.input_specs}
    problems = []
    user_inputs = [
        n
        for n in ep.graph.nodes
        if n.op == "placeholder" and sig[n.name].kind == InputKind.USER_INPUT
    ]
    symbols.declare_from_inputs([(n.name, n.meta["val"]) for n in user_inputs])
    table = lowerings()
    for n in ep.graph.nodes:
        ctx.node = n
        if n.op == "placeholder":
            ctx.env[n] = _lower_placeholder(ctx, ep, sig[n.name], problems)
        elif n.op == "call_function":
            ctx.env[n] = _lower_node(ctx, table, n, problems)
        elif n.op == "output":
            _lower_outputs(ctx, n, output_names, problems)
        else:
            problems.append(
                Problem(f"fx op {n.op}", n.name, source_location(n, strip_prefix), "not supported")
            )
            ctx.env[n] = POISON
    if problems:
        raise UnsupportedOpsError(problems)
    return {"symbols": symbols.names(), "fusions": fusions}


def _lower_placeholder(ctx, ep, spec, problems):
    """A parameter, buffer or constant becomes a constant slot; a user input a graph input."""
    n, prefix = ctx.node, ctx.strip_prefix
    if spec.kind in _CONSTANT_KINDS:
        if not n.users:
            return None  # an unused buffer costs file bytes for nothing
        tensor = (
            ep.state_dict[spec.target]
            if spec.target in ep.state_dict
            else ep.constants[spec.target]
        )
        arr, dtype = _constant_array(tensor)
        name = spec.target[len(prefix):] if spec.target.startswith(prefix) else spec.target
        return Slot(ctx.writer.add_constant(name, arr, dtype))
    if spec.kind == InputKind.USER_INPUT:
        slot = ctx.new_tensor(name=n.name)
        ctx.writer.add_input(n.name, slot)
        return Slot(slot)
    problems.append(Problem(f"input kind {spec.kind.name}", n.name, "<signature>", "not supported"))
    return POISON


def _lower_outputs(ctx, n, output_names, problems) -> None:
    outs = n.args[0]
    if len(outs) != len(output_names):
        raise ValueError(
            f"the program has {len(outs)} outputs, expected {len(output_names)} "
            f"({', '.join(output_names)})"
        )
    for name, arg in zip(output_names, outs, strict=True):
        v = ctx.lookup(arg)
        if isinstance(v, Slot):
            ctx.writer.add_output(name, v.index)
        elif v is not POISON:  # a poisoned output is a consequence, already reported
            where = (
                source_location(arg, ctx.strip_prefix)
                if isinstance(arg, torch.fx.Node)
                else "<output>"
            )
            problems.append(Problem(f"output {name}", n.name, where, f"is not a tensor ({v!r})"))


def _inputs_poisoned(ctx, n) -> bool:
    found = []
    torch.fx.node.map_arg((n.args, n.kwargs), lambda a: found.append(ctx.env.get(a) is POISON))
    return any(found)


def _lower_node(ctx, table, n, problems):
    fn = table.get(n.target)
    if fn is None:
        reason = "no lowering"
    elif _inputs_poisoned(ctx, n):
        return POISON  # a consequence of an earlier problem, already reported
    else:
        try:
            return fn(ctx, n)
        except LoweringError as e:
            reason = str(e)
        except Exception as e:  # a bug in a lowering: still one report, not a traceback
            reason = f"internal error in its lowering, please report: {type(e).__name__}: {e}"
    problems.append(
        Problem(_target_name(n.target), n.name, source_location(n, ctx.strip_prefix), reason)
    )
    return POISON


__all__ = ["lower_program", "LoweringContext", "UnsupportedOpsError", "Problem",
           "source_location", "module_path"]
