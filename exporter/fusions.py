"""Pattern fusions on the decomposed fx graph, run before lowering.

Each pass finds one pattern that decompositions spread over many ATen nodes and replaces
it with one node whose lowering emits one fused graph node:

- linear: ``mm/addmm(x, permute(W, [1, 0]))`` of a constant W becomes ``aten.linear(x, W, b)``
  (a LinearNode reading W as torch stores it), and with the flattening ``view``s around
  it, a LinearNode on x's own shape with no reshapes; ``mm/addmm(x, W)`` of a constant
  ``W [in, out]`` read nowhere else (GPT-2's Conv1D) likewise, W then stored transposed
  (so it quantizes as a Linear: exporter/quantize.py);
- silu: ``x * sigmoid(x)`` becomes ``aten.silu(x)``;
- rms_norm: Hugging Face's RMSNorm (optional float32 upcast, ``x * rsqrt(mean(x^2) + eps)``,
  optional cast back, times ``weight`` or ``(weight + offset)``) becomes :func:`fused_rms_norm`;
- rope: rotate-half RoPE ``x * cos + cat(-x2, x1) * sin`` becomes :func:`fused_rope`;

and then identical ATen nodes are merged (common subexpressions).

A pattern fuses only when every intermediate node has no other user, so nothing else can
observe the difference. The fused nodes keep the last replaced node's metadata (traced
value, module stack, stack trace), so provenance and dtypes stay accurate.
"""

import torch

aten = torch.ops.aten
_CASTS = (aten._to_copy.default,)


def fused_rms_norm(x, weight, eps: float, weight_offset: float):
    """Reference semantics of the fused RMSNorm (float32 math): what RmsNormNode computes."""
    h = x.float()
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return out if weight is None else out * (weight.float() + weight_offset)


def fused_rope(x, cos, sin):
    """Reference semantics of the fused rotate-half RoPE: what RopeNode computes."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _only_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _is(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _replace(graph, last, target, args, dead):
    """Insert ``target(*args)`` before ``last``, take over its uses and metadata, drop ``dead``."""
    with graph.inserting_before(last):
        new = graph.call_function(target, tuple(args))
    new.meta = dict(last.meta)
    last.replace_all_uses_with(new)
    # Erase consumers before producers: repeat until nothing more becomes unused.
    pending = [n for n in dict.fromkeys([last, *dead]) if n.op == "call_function"]
    while True:
        free = [n for n in pending if not n.users]
        if not free:
            break
        for n in free:
            graph.erase_node(n)
            pending.remove(n)
    return new


def _static_shape(node):
    return [d if isinstance(d, int) else str(d) for d in node.meta["val"].shape]


def fuse_linear(graph, constants, transpose=None) -> int:
    """x @ W.T (+ b) of a constant weight as one aten.linear.

    ``mm/addmm(flat, permute(W, [1, 0]))`` becomes ``linear(flat, W)``; when ``flat`` is
    a flattening view whose product is viewed back to the same leading dims, the linear
    reads the unflattened input and both views go too. With ``transpose`` (a function
    storing a constant placeholder transposed), ``mm/addmm(flat, W)`` of a 2-D constant W
    with no other reader becomes ``linear(flat, W.T)`` too.
    """
    count = 0
    for mm in list(graph.nodes):
        if not _is(mm, aten.mm.default, aten.addmm.default):
            continue
        bias = None
        if mm.target == aten.addmm.default:
            if mm.kwargs.get("alpha", 1) != 1 or mm.kwargs.get("beta", 1) != 1:
                continue
            bias, flat, wt = mm.args
            if len(bias.meta["val"].shape) != 1:
                continue
        else:
            flat, wt = mm.args
        stored = (transpose is not None and wt in constants and len(wt.users) == 1
                  and len(wt.meta["val"].shape) == 2)
        if not stored and not (_is(wt, aten.permute.default) and list(wt.args[1]) == [1, 0]
                               and wt.args[0] in constants):
            continue
        x, last, dead = flat, mm, [] if stored else [wt]
        back = _only_user(mm)
        if _is(flat, aten.view.default) and _only_user(flat) is mm and _is(back, aten.view.default):
            inner = flat.args[0]
            if (len(_static_shape(inner)) >= 2
                and _static_shape(back)[:-1] == _static_shape(inner)[:-1]):
                x, last, dead = inner, back, [mm, flat] + dead
        if stored:
            transpose(wt)
        args = [x, wt if stored else wt.args[0]] + ([bias] if bias is not None else [])
        _replace(graph, last, aten.linear.default, args, dead)
        count += 1
    return count


def fuse_silu(graph) -> int:
    """x * sigmoid(x) as silu(x)."""
    count = 0
    for sig in list(graph.nodes):
        if not _is(sig, aten.sigmoid.default):
            continue
        mul = _only_user(sig)
        x = sig.args[0]
        if (_is(mul, aten.mul.Tensor) and set(mul.args) == {x, sig}
            and mul.args[0] is not mul.args[1]):
            _replace(graph, mul, aten.silu.default, [x], [sig])
            count += 1
    return count


def _other(node, one):
    a, b = node.args[0], node.args[1]
    return b if a is one else a if b is one else None


def _weight(node, constants):
    """(weight, offset, intermediates) when node is a constant 1-D weight, maybe cast, maybe
    plus a scalar; (None, 0, []) otherwise."""
    offset, chain = 0.0, []
    if (_is(node, aten.add.Tensor) and isinstance(node.args[1], int | float)
        and len(node.users) == 1):
        chain.append(node)
        node, offset = node.args[0], float(node.args[1])
    if _is(node, *_CASTS) and len(node.users) == 1:
        chain.append(node)
        node = node.args[0]
    if node in constants and len(node.meta["val"].shape) == 1:
        return node, offset, chain
    return None, 0.0, []


def fuse_rms_norm(graph, constants) -> int:
    """Hugging Face RMSNorm as one fused_rms_norm node."""
    count = 0
    for rs in list(graph.nodes):
        if not _is(rs, aten.rsqrt.default):
            continue
        add, norm = rs.args[0], _only_user(rs)
        if not (_is(add, aten.add.Tensor) and isinstance(add.args[1], float)
                and _is(norm, aten.mul.Tensor)):
            continue
        mean = add.args[0]
        if not (_is(mean, aten.mean.dim) and len(mean.args) > 2 and mean.args[2] and not mean.kwargs
                and _only_user(mean) is add and _only_user(add) is rs):
            continue
        pw = mean.args[0]
        h = pw.args[0] if _is(pw, aten.pow.Tensor_Scalar) and pw.args[1] == 2 else None
        rank = len(pw.meta["val"].shape) if h is not None else 0
        if (h is None or [d % rank for d in mean.args[1]] != [rank - 1]
            or _only_user(pw) is not mean):
            continue
        if _other(norm, rs) is not h:
            continue
        x = h.args[0] if _is(h, *_CASTS) else h
        if h is not x and set(h.users) != {pw, norm}:
            continue  # the upcast is used elsewhere too: it must stay
        dead = [rs, add, mean, pw] + ([h] if h is not x else [])
        last, weight, offset = norm, None, 0.0
        cast, mul = None, _only_user(norm)
        if _is(mul, *_CASTS):
            cast, mul = mul, _only_user(mul)
        if _is(mul, aten.mul.Tensor):
            w, offset, chain = _weight(_other(mul, cast or norm), constants)
            if w is not None:
                dead += [norm] + ([cast] if cast is not None else []) + chain
                last, weight = mul, w
            else:
                offset = 0.0
        _replace(graph, last, fused_rms_norm, [x, weight, float(add.args[1]), offset], dead)
        count += 1
    return count


def _half_slice(node, x, start_is_zero: bool):
    """The half of x's last axis a rotate-half slice takes, or None."""
    if not (_is(node, aten.slice.Tensor) and node.args[0] is x and _only_user(node) is not None):
        return None
    rank = len(x.meta["val"].shape)
    dim, start = node.args[1] % rank, node.args[2]
    end = node.args[3] if len(node.args) > 3 else None
    d = x.meta["val"].shape[-1]
    if dim != rank - 1 or not isinstance(d, int) or d % 2:
        return None
    if start_is_zero:
        return d // 2 if start == 0 and end == d // 2 else None
    return d // 2 if start == d // 2 and (end is None or end >= d) else None


def fuse_rope(graph) -> int:
    """x * cos + cat([-x2, x1], -1) * sin as one fused_rope node."""
    count = 0
    for cat in list(graph.nodes):
        if not (_is(cat, aten.cat.default) and len(cat.args[0]) == 2):
            continue
        neg, lo = cat.args[0]
        if not _is(neg, aten.neg.default):
            continue
        hi = neg.args[0]
        x = hi.args[0] if _is(hi, aten.slice.Tensor) else None
        if x is None or _half_slice(hi, x, False) is None or _half_slice(lo, x, True) is None:
            continue
        mul_sin, rank = _only_user(cat), len(x.meta["val"].shape)
        if (cat.args[1] % rank != rank - 1 or not _is(mul_sin, aten.mul.Tensor)
            or _only_user(neg) is not cat):
            continue
        sin = _other(mul_sin, cat)
        add = _only_user(mul_sin)
        if not _is(add, aten.add.Tensor) or len(add.args) != 2 or add.kwargs:
            continue
        mul_cos = _other(add, mul_sin)
        if not _is(mul_cos, aten.mul.Tensor) or _only_user(mul_cos) is not add:
            continue
        cos = _other(mul_cos, x)
        if cos is None or sin is None:
            continue
        _replace(graph, add, fused_rope, [x, cos, sin], [mul_sin, mul_cos, cat, neg, hi, lo])
        count += 1
    return count


def eliminate_common_subexpressions(graph) -> int:
    """Merge ATen nodes with the same target and arguments (e.g. each layer's unsqueeze of
    the shared cos/sin). Only ``aten`` ops: they are functional after decompositions, while
    ``mlxgraph::update_and_attend`` is stateful at run time and must never merge."""
    seen, count = {}, 0
    for n in list(graph.nodes):
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        if (n.target.namespace != "aten" or not n.users
            or torch.Tag.nondeterministic_seeded in n.target.tags):
            continue
        try:
            key = (n.target, _freeze(n.args), _freeze(n.kwargs))
            hash(key)
        except TypeError:
            continue
        if key in seen:
            n.replace_all_uses_with(seen[key])
            graph.erase_node(n)
            count += 1
        else:
            seen[key] = n
    return count


def _freeze(x):
    if isinstance(x, list | tuple):
        return (type(x).__name__, *(_freeze(i) for i in x))
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    if isinstance(x, float):
        return ("float", x)  # 1 and 1.0 differ in torch's type promotion
    return x


def _transposer(ep):
    """A function storing a constant placeholder of ``ep`` transposed (state and traced value)."""
    targets = {s.arg.name: s.target for s in ep.graph_signature.input_specs}

    def transpose(node):
        target = targets[node.name]
        store = ep.state_dict if target in ep.state_dict else ep.constants
        store[target] = store[target].detach().t().contiguous()
        node.meta["val"] = node.meta["val"].t()

    return transpose


def drop_dtype_assertions(graph) -> None:
    """Erase the dtype assertions: no value, but they count as users, which would block
    every pattern and keep what they check alive."""
    for n in list(graph.nodes):
        if _is(n, aten._assert_tensor_metadata.default) and not n.users:
            graph.erase_node(n)


def drop_dead_code(graph) -> None:
    """Erase what nothing reads: dtype assertions (drop_dtype_assertions), then every pure
    node whose result reaches no output (the mask a model builds for attention code the
    adapter routed to the op, GPT-Neo's: neither lowered nor refused for its ops)."""
    drop_dtype_assertions(graph)
    graph.eliminate_dead_code()


def run_fusions(ep) -> dict:
    """Apply every fusion to an exported program's graph in place; returns counts per pattern."""
    graph = ep.graph_module.graph
    kinds = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")
    names = {s.arg.name for s in ep.graph_signature.input_specs if s.kind.name in kinds}
    constants = {n for n in graph.nodes if n.op == "placeholder" and n.name in names}
    drop_dead_code(graph)
    counts = {
        "linear": fuse_linear(graph, constants, _transposer(ep)),
        "silu": fuse_silu(graph),
        "rms_norm": fuse_rms_norm(graph, constants),
        "rope": fuse_rope(graph),
        # Last: merging first would share one flattening view among q/k/v projections,
        # which the linear pattern (a view with one user) would then miss.
        "cse": eliminate_common_subexpressions(graph),
    }
    graph.lint()
    return counts


__all__ = ["run_fusions", "drop_dead_code", "drop_dtype_assertions", "fused_rms_norm",
           "fused_rope"]
