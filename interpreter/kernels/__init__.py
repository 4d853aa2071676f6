"""MLX kernels: one small registered function per op.

A kernel is called as ``fn(**inputs, **attributes)``: its op's input and attribute
fields by name (schema/spec.py's field model; never the output fields). Tensor inputs
come as mx.array; Operand inputs as mx.array (tensor), Python int (value slot) or Python
scalar (literal, kept weak so it does not promote the tensor's dtype); DType attributes
as mx.Dtype (or None); other attributes as Python values. Kernels registered with
``needs_context=True`` also get ``ctx`` (the running step: its KV stores). A kernel
returns the op's output: an array (or an int for a value output), or a list of them for
a list output. Kernels never force an evaluation.

An op may also have a variant for one kind of device (``register(op, device="gpu")``):
the program's plan, chosen at load from MLX's default device (docs/architecture.md,
"Device plans"), takes the variant there and the op's one kernel everywhere else. A
variant computes what the kernel computes; docs/precision.md states any rounding that
differs.
"""

from dataclasses import dataclass

from mlxgraph.schema.op_catalogue import entry
from mlxgraph.schema.registry import LazyRegistry


@dataclass(frozen=True)
class Kernel:
    """A registered kernel."""

    op: str              # op table name, e.g. 'AddNode'
    fn: object
    needs_context: bool
    device: str | None = None  # None: every device; else the plan it is the variant for


OP_MODULES = ("elementwise", "reductions", "linalg", "layout", "creation", "symbolic", "fused",
              "attention", "selection", "quantized", "gpu", "state")
KERNELS = LazyRegistry(__name__, OP_MODULES)
DEVICE_PLANS = ("cpu", "gpu")


def register(op: str, needs_context: bool = False, device: str | None = None):
    """Decorator: register ``fn`` as the kernel of ``op`` ('Add' or 'AddNode'), or as its
    variant for one device plan.

    Raises:
        KeyError: the op catalogue has no such op. ValueError: an unknown device plan, or a
        second registration of the same op and device.
    """
    name = entry(op).table
    if device is not None and device not in DEVICE_PLANS:
        raise ValueError(f"register({op!r}): device must be one of {DEVICE_PLANS}")

    def wrap(fn):
        key = (name, device)
        if key in KERNELS.entries:
            raise ValueError(f"{name}: a kernel is already registered for device {device}")
        KERNELS.add(key, Kernel(name, fn, needs_context, device))
        return fn

    return wrap


def get_kernel(op: str, device: str | None = None) -> Kernel | None:
    """The kernel for an op table name on a device plan (its variant there, else the op's
    kernel), or None when this version has none."""
    table = KERNELS.table()
    return table.get((op, device)) or table.get((op, None))
