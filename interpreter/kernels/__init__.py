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

An op may also have a variant a load option asks for (``register(op, variant="int8")``:
Program.load's ``int8_activations``), which computes the op with a rounding the user chose
(docs/precision.md); it takes precedence over the device's kernel where the op has one.
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
VARIANTS = ("int8",)   # int8: quantized products with x rounded to int8 (int8_activations)


def register(op: str, needs_context: bool = False, device: str | None = None,
             variant: str | None = None):
    """Decorator: register ``fn`` as the kernel of ``op`` ('Add' or 'AddNode'), as its
    variant for one device plan, or as the variant a load option asks for.

    Raises:
        KeyError: the op catalogue has no such op. ValueError: an unknown device plan or
        variant, both at once, or a second registration of the same op and key.
    """
    name = entry(op).table
    if device is not None and device not in DEVICE_PLANS:
        raise ValueError(f"register({op!r}): device must be one of {DEVICE_PLANS}")
    if variant is not None and (variant not in VARIANTS or device is not None):
        raise ValueError(f"register({op!r}): variant must be one of {VARIANTS}, no device")

    def wrap(fn):
        key = (name, device or variant)
        if key in KERNELS.entries:
            where = f"variant {variant}" if variant else f"device {device}"
            raise ValueError(f"{name}: a kernel is already registered for {where}")
        KERNELS.add(key, Kernel(name, fn, needs_context, device))
        return fn

    return wrap


def get_kernel(op: str, device: str | None = None, variant: str | None = None) -> Kernel | None:
    """The kernel for an op table name: the load option's ``variant`` where the op has one,
    else its variant for the device plan, else the op's kernel; None when this version has
    none."""
    table = KERNELS.table()
    return ((variant and table.get((op, variant))) or table.get((op, device))
            or table.get((op, None)))


def variant_ops(variant: str) -> frozenset:
    """The op table names that have a kernel for the load option's ``variant``."""
    return frozenset(op for op, key in KERNELS.table() if key == variant)
