"""MLX kernels: one small registered function per op.

A kernel is called as ``fn(**inputs, **attributes)``: its op's input and attribute
fields by name (schema/spec.py's field model; never the output fields). Tensor inputs
come as mx.array; Operand inputs as mx.array (tensor), Python int (value slot) or Python
scalar (literal, kept weak so it does not promote the tensor's dtype); DType attributes
as mx.Dtype (or None); other attributes as Python values. Kernels registered with
``needs_context=True`` also get ``ctx`` (the running step: its KV stores). A kernel
returns the op's output: an array (or an int for a value output), or a list of them for
a list output. Kernels never force an evaluation.
"""

from dataclasses import dataclass

from mlxgraph.schema.registry import LazyRegistry
from mlxgraph.schema.spec import op_spec


@dataclass(frozen=True)
class Kernel:
    """A registered kernel."""

    op: str              # op table name, e.g. 'AddNode'
    fn: object
    needs_context: bool


OP_MODULES = ("elementwise", "reductions", "linalg", "layout", "creation", "symbolic", "fused",
              "attention", "selection", "quantized")
KERNELS = LazyRegistry(__name__, OP_MODULES)


def register(op: str, needs_context: bool = False):
    """Decorator: register ``fn`` as the kernel of ``op`` ('Add' or 'AddNode').

    Raises:
        KeyError: the schema has no such op.
    """
    name = op_spec(op).name

    def wrap(fn):
        KERNELS.add(name, Kernel(name, fn, needs_context))
        return fn

    return wrap


def get_kernel(op: str) -> Kernel | None:
    """The kernel for an op table name, or None when this version has none."""
    return KERNELS.table().get(op)
