"""A program's nodes compiled once, at load, into one straight-line Python function.

The general loop (node_runner.run_nodes) looks up, for every node of every step, where
each input comes from, copies the node's fixed attributes into a fresh keyword dict and
checks its options. On an accelerator the host builds each step's graph while the device
waits, so that per-node work is the decode step's critical path. Here every lookup is
resolved when the program loads: each node becomes one line calling its kernel with its
slots and attributes written out, e.g.

    i = 7; r = k7(x=t[12], weight=t[3], eps=a7_eps); t[13] = r if ... r.dtype == d7_0 else ...

The function runs the same kernels in the same order on the same inputs as the loop, so
its result is the loop's bit for bit (tests/test_straight_line.py). The loop remains for
the steps that need its options: an observer, the first step of a shape (outputs checked
against the verifier's bounds), a prefill's last-row LM head. Nodes with an index guard
call back into the loop's per-node code. Generating source and ``exec`` is how the
standard library builds dataclasses and namedtuples; every name in it is an identifier
made here, and every value from the file is bound in the namespace, never written into
the source.
"""

import keyword

import mlx.core as mx

from mlxgraph.schema.spec import FieldKind

TENSOR, TENSOR_LIST, VALUE = FieldKind.TENSOR, FieldKind.TENSOR_LIST, FieldKind.VALUE
OUT, OUT_LIST, VALUE_OUT = FieldKind.OUT, FieldKind.OUT_LIST, FieldKind.VALUE_OUT


def _node_lines(k: int, node, ns: dict) -> list | None:
    """The source lines of node ``k`` (its position in the plan), binding what they name;
    None when a field's name cannot be written as a keyword argument."""
    names = [*node.fixed, *(n for n, _ in node.tensor_reads), *(n for n, _, _ in node.reads)]
    if any(keyword.iskeyword(n) or not n.isidentifier() for n in names):
        return None
    ns[f"k{k}"] = node.fn
    args = []
    for name, value in node.fixed.items():
        ns[f"a{k}_{name}"] = value
        args.append(f"{name}=a{k}_{name}")
    args += [f"{name}=t[{slot}]" for name, slot in node.tensor_reads]
    for name, how, where in node.reads:
        if how is VALUE:
            args.append(f"{name}=v[{where}]")
        elif how is TENSOR_LIST:
            args.append(f"{name}=[{', '.join(f't[{s}]' for s in where)}]")
        else:  # OPERAND_LIST: tensors, runtime ints and literals mixed
            items = []
            for j, (h, w) in enumerate(where):
                if h is TENSOR:
                    items.append(f"t[{w}]")
                elif h is VALUE:
                    items.append(f"v[{w}]")
                else:
                    ns[f"l{k}_{name}_{j}"] = w
                    items.append(f"l{k}_{name}_{j}")
            args.append(f"{name}=[{', '.join(items)}]")
    if node.needs_context:
        args.append("ctx=ctx")
    lines = [f"i = {k}", f"r = k{k}({', '.join(args)})"]
    if node.out_kind is VALUE_OUT:
        lines.append(f"v[{node.out_slots[0]}] = r")
        return lines
    for j, (slot, dtype) in enumerate(zip(node.out_slots, node.out_dtypes)):
        got = "r" if node.out_kind is OUT else f"r[{j}]"
        if dtype is None:
            lines.append(f"t[{slot}] = {got}")
        else:
            ns[f"d{k}_{j}"] = dtype
            d = f"d{k}_{j}"  # converted only when an MLX array of another dtype (the loop's rule)
            lines.append(f"t[{slot}] = {got} if not isinstance({got}, _A) or {got}.dtype == {d} "
                         f"else {got}.astype({d})")
    return lines


def compile_nodes(nodes, run_one, fail):
    """One function ``run(tensors, values, ctx, flags)`` that runs ``nodes`` in order.

    Args:
        nodes: the program's ResolvedNodes.
        run_one: ``run_one(node, tensors, values, ctx, flags)``: the loop's per-node code,
            called for nodes with an index guard (and any whose field names could not be
            written as keyword arguments).
        fail: ``fail(node, exception) -> Exception``: the located error a kernel's
            exception becomes (the loop's node_error).
    """
    ns = {"_A": mx.array, "_run_one": run_one, "_fail": fail, "_nodes": tuple(nodes)}
    body = []
    for k, node in enumerate(nodes):
        lines = None if node.guard is not None else _node_lines(k, node, ns)
        if lines is None:
            lines = [f"i = {k}", f"_run_one(_nodes[{k}], t, v, ctx, flags)"]
        body += lines
    source = "\n".join(
        ["def run(t, v, ctx, flags):", "    i = -1", "    try:"]
        + [f"        {line}" for line in body or ["pass"]]
        + ["    except Exception as e:",
           "        if i < 0:",
           "            raise",
           "        raise _fail(_nodes[i], e) from e"]
    )
    exec(compile(source, "<mlxgraph straight-line step>", "exec"), ns)  # noqa: S102
    return ns["run"]
