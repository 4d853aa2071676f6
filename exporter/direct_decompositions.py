"""The default table's result for a program that needs only a few local rewrites, made
on the traced graph itself instead of by run_decompositions' re-trace.

run_decompositions re-traces the whole program (functionalization's metadata pass, then
the capture), symbolic shape reasoning at every node, to rewrite what a Llama-shaped
trace holds of non-core ATen: ``to`` casts, transposes, reshapes, ``contiguous``. On the
small Llama of benchmarks/quantize_export_bench.py that re-trace was 2.6 s of its 7.6 s
export. Each of those ops has one local decomposition (its CompositeImplicitAutograd
kernel, or the table's ``transpose``), decided by what the traced values already hold:

- ``to.dtype(x, dtype)``: ``x`` itself when it already has that dtype, else
  ``_to_copy(x, dtype=dtype)``; ``to.device(x, device, dtype)``: ``x`` itself when
  nothing changes (anything else goes to the re-trace);
- ``transpose.int(x, a, b)``: ``permute(x, dims)`` with ``a`` and ``b`` swapped;
- ``reshape(x, shape)`` of an ``x`` contiguous whatever the symbols' values:
  ``view(x, shape)``, the shape as given (reshape's contiguous fast path);
- ``contiguous(x)``: ``x`` itself when it is contiguous whatever the symbols' values;
  ``clone(x, memory_format=contiguous_format)`` when it is not contiguous at the traced
  example either (whether torch decides by the example or only by what is known for every
  value, it clones), and the re-trace when the two disagree.

Every other node must be one the re-trace keeps as it is: an ATen or custom op with no
entry in the default table and no CompositeImplicitAutograd kernel, that mutates
nothing; aten.linear and aten.silu as decompositions.ops_kept_whole keeps them;
placeholders and the output. A program holding anything else (a higher-order op, a
submodule call, Python arithmetic on sizes, a lifted constant, a mutated input or
buffer) is re-traced, as is one where any rewrite above does not apply. The graph is
then the default table's, node for node (tests/test_export_decompositions.py exports
every tiny model the tests build both ways); each rewritten node keeps the traced node's
metadata (its value, module path, stack trace), as the re-trace's would.
"""

import torch
from torch.export import default_decompositions
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.experimental.symbolic_shapes import guarding_hint_or_throw, statically_known_true

_aten = torch.ops.aten
_KEPT_WHOLE = (_aten.linear.default, _aten.silu.default)
# Not a dispatched op: the re-trace records it again where a size is read.
_SYM_SIZE = _aten.sym_size.int
_INPUT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.USER_INPUT)


def contiguous_for_every_value(val) -> bool:
    """Whether ``val``'s strides equal its contiguous strides for every value of its
    symbols (a size-1 dim's stride is skipped only where the size is statically 1), as
    TensorImpl's compute_contiguous would find them."""
    expected = 1
    for size, stride in reversed(tuple(zip(val.shape, val.stride()))):
        if statically_known_true(size == 1):
            continue
        if not statically_known_true(stride == expected):
            return False
        expected = expected * size
    return True


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _hint(size) -> int:
    """A size or stride at the traced example (its symbols' hints)."""
    return guarding_hint_or_throw(size) if isinstance(size, torch.SymInt) else int(size)


def _contiguous_at_example(val) -> bool:
    """Whether ``val`` is contiguous at the traced example's sizes."""
    expected = 1
    for size, stride in reversed(tuple(zip(val.shape, val.stride()))):
        size = _hint(size)
        if size == 1:
            continue
        if _hint(stride) != expected:
            return False
        expected *= size
    return True


def _to_dtype(node):
    x, dtype = node.args
    if node.kwargs or not isinstance(_val(x), torch.Tensor):
        return None
    if _val(x).dtype == dtype:
        return x
    return (_aten._to_copy.default, (x,), {"dtype": dtype})


def _to_device(node):
    if node.kwargs or len(node.args) != 3:
        return None
    x, device, dtype = node.args
    val = _val(x)
    same = isinstance(val, torch.Tensor) and val.device == device and val.dtype == dtype
    return x if same else None


def _transpose(node):
    x, a, b = node.args
    val = _val(x)
    if node.kwargs or not isinstance(val, torch.Tensor) or val.ndim < 2:
        return None
    a, b = a % val.ndim, b % val.ndim
    if a == b:
        return None
    dims = list(range(val.ndim))
    dims[a], dims[b] = b, a
    return (_aten.permute.default, (x, dims), {})


def _reshape(node):
    x, shape = node.args
    val = _val(x)
    if node.kwargs or not isinstance(val, torch.Tensor) or not contiguous_for_every_value(val):
        return None
    return (_aten.view.default, (x, shape), {})


def _contiguous(node):
    (x,) = node.args
    val = _val(x)
    if node.kwargs or not isinstance(val, torch.Tensor):
        return None
    if contiguous_for_every_value(val):
        return x
    if not _contiguous_at_example(val):
        return (_aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
    return None


# op -> fn(node): the node's replacement (an existing node, or (op, args, kwargs)), or
# None where the local rewrite does not apply.
REWRITES = {
    _aten.to.dtype: _to_dtype,
    _aten.to.device: _to_device,
    _aten.transpose.int: _transpose,
    _aten.reshape.default: _reshape,
    _aten.contiguous.default: _contiguous,
}


def _kept(op, table) -> bool:
    """Whether the re-trace records ``op`` as it is."""
    if op is _SYM_SIZE:
        return True
    if op in table or op._schema.is_mutable:
        return False
    return not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(),
                                                               "CompositeImplicitAutograd")


def _plan(ep):
    """{node: replacement} for every node that needs one, or None (re-trace)."""
    sig = ep.graph_signature
    # (non-persistent buffers are kept in ep.constants, before and after the re-trace)
    if (set(ep.constants) - set(sig.non_persistent_buffers)
            or any(s.kind not in _INPUT_KINDS for s in sig.input_specs)
            or any(s.kind != OutputKind.USER_OUTPUT for s in sig.output_specs)):
        return None
    table = default_decompositions().materialize()
    plan = {}
    for n in ep.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            return None
        if n.target in REWRITES:
            replacement = REWRITES[n.target](n)
            if replacement is None:
                return None
            plan[n] = replacement
        elif n.target not in _KEPT_WHOLE and not _kept(n.target, table):
            return None
    return plan


def decompose_directly(ep) -> bool:
    """Rewrite ``ep``'s graph in place into what the default table (less aten.linear and
    aten.silu) would make of it, when the module docstring's rewrites are all it needs;
    returns False, ``ep`` untouched, otherwise. The caller has checked the linears and
    SiLUs (decompositions.ops_kept_whole)."""
    plan = _plan(ep)
    if plan is None:
        return False
    graph, done = ep.graph, {}  # node -> what now stands for it
    for node, replacement in plan.items():  # in graph order: an argument is already done
        if isinstance(replacement, torch.fx.Node):
            new = done.get(replacement, replacement)
        else:
            op, args, kwargs = torch.fx.node.map_arg(replacement, lambda a: done.get(a, a))
            with graph.inserting_before(node):
                new = graph.call_function(op, args, kwargs)
            new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        done[node] = new
    ep.graph_module.recompile()
    return True


__all__ = ["contiguous_for_every_value", "decompose_directly", "REWRITES"]
