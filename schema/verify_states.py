"""The recurrent states a session will keep per layer_id (format 1.3): what ``load`` needs.

Every node with a recurrent state (``Trait.STATE``: CausalConv, SsdScan,
GatedDelta, SelectiveScan) names its state by
``layer_id``; the session allocates zeros of the shape and dtype ``metadata.states`` gives
for it before the first step (docs/architecture.md#recurrent-state). So each id is used by
one node and has one entry, the ids are disjoint from the attention layers' (one session
keys KV caches and states alike, and a saved cache file names both ``layer.<id>``), the
state is small enough (the file's element limit) and its shape is the one the node's
weight implies, so a kernel never reads a state of another shape.
"""

import math

from mlxgraph.schema.dtypes import dtype_info, is_known_code
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.schema.spec import op_specs
from mlxgraph.schema.verify_layers import MAX_LAYER_ID

MAX_DIM = 2**31 - 1


def _static(g, slot, field) -> list:
    dims = g.tensors[slot].shape
    if any(d.symbol != -1 for d in dims):
        raise GraphFormatError("must have a static shape", field=field)
    return [d.size for d in dims]


def _entries(g, limit: int) -> dict:
    """{layer_id: (index, shape, dtype code)} of metadata.states, each entry checked."""
    meta = g.metadata
    attention = {lc.layer_id for lc in (meta.layers or ())} if meta is not None else set()
    out = {}
    for i, st in enumerate((meta.states or ()) if meta is not None else ()):
        field = f"metadata.states[{i}]"
        lid, shape = st.layer_id, list(st.shape or ())
        if lid is None or not 0 <= lid <= MAX_LAYER_ID:
            raise GraphFormatError(f"layer_id {lid} is not in [0, {MAX_LAYER_ID}]", field=field)
        if lid in out or lid in attention:
            raise GraphFormatError(f"layer_id {lid} names two states or a state and a KV "
                                   "cache: each needs an id of its own", field=field)
        if st.dtype is None or not is_known_code(st.dtype) or not dtype_info(st.dtype).is_float:
            raise GraphFormatError("a state's dtype must be a floating dtype", field=field)
        if len(shape) not in (3, 4) or shape[0] != 1 or not all(1 <= d <= MAX_DIM for d in shape):
            raise GraphFormatError(f"shape {shape} is not [1, ...] of rank 3 or 4 with dims >= 1",
                                   field=field)
        if math.prod(shape) > limit:
            raise GraphFormatError(f"shape {shape} holds more than the limit of {limit} "
                                   "elements for this file", field=field)
        out[lid] = (i, shape, st.dtype)
    return out


def _check_conv(g, t, shape, code) -> None:
    """A CausalConv node against its state [1, C, K - 1]."""
    weight = _static(g, t.weight, "weight")
    if len(weight) != 2 or weight[1] < 2 or [1, weight[0], weight[1] - 1] != shape:
        raise GraphFormatError(f"weight {weight} is not [C, K] with K >= 2 for the state "
                               f"{shape} = [1, C, K - 1]", field="weight")
    if t.bias is not None and _static(g, t.bias, "bias") != weight[:1]:
        raise GraphFormatError(f"bias must be [{weight[0]}]", field="bias")
    for field in ("x", "out"):
        dims = g.tensors[getattr(t, field)].shape
        static = [d.size if d.symbol == -1 else None for d in dims]
        if len(static) != 3 or static[:2] != [1, weight[0]]:
            raise GraphFormatError(f"must be [1, {weight[0]}, T] (static batch and channels)",
                                   field=field)
        if g.tensors[getattr(t, field)].dtype != code:
            raise GraphFormatError(f"its dtype must be the state's, "
                                   f"{dtype_info(code).name}", field=field)
    for field in ("weight", "bias"):
        slot = getattr(t, field)
        if slot is not None and not _is_float(g.tensors[slot].dtype):
            raise GraphFormatError("must have a floating dtype", field=field)


def _dims(g, slot, field, rank: int, token_axis: int) -> list:
    """A slot's dims, static except the token axis (None there)."""
    dims = g.tensors[slot].shape
    if len(dims) != rank or any(d.symbol != -1 for i, d in enumerate(dims) if i != token_axis):
        raise GraphFormatError(f"must have rank {rank}, static but for its token axis "
                               f"{token_axis}", field=field)
    return [None if i == token_axis else d.size for i, d in enumerate(dims)]


def _check_ssd(g, t, shape, code) -> None:
    """An SsdScan node against its state [1, H, P, N] (float32)."""
    x = _dims(g, t.x, "x", 4, 1)
    heads, head_dim = x[2], x[3]
    groups, size = _dims(g, t.b, "b", 4, 1)[2:]
    if x[0] != 1 or groups < 1 or heads % groups or [1, heads, head_dim, size] != shape:
        raise GraphFormatError(f"x [1, T, {heads}, {head_dim}] and b [1, T, {groups}, {size}] "
                               f"do not make the state {shape} = [1, H, P, N] with H a "
                               "multiple of G", field="x")
    if code != dtype_info("float32").code:
        raise GraphFormatError("an SSD scan's state must be float32", field="layer_id")
    want = {"c": [1, None, groups, size], "dt": [1, None, heads], "out": [1, None, heads,
                                                                           head_dim]}
    for field, dims in want.items():
        if _dims(g, getattr(t, field), field, len(dims), 1) != dims:
            raise GraphFormatError(f"must be {[d if d else 'T' for d in dims]}", field=field)
    for field in ("a", "d", "dt_bias"):
        if _static(g, getattr(t, field), field) != [heads]:
            raise GraphFormatError(f"must be [{heads}]", field=field)
    for field in ("x", "dt", "a", "b", "c", "d", "dt_bias", "out"):
        if not _is_float(g.tensors[getattr(t, field)].dtype):
            raise GraphFormatError("must have a floating dtype", field=field)
    if g.tensors[t.out].dtype != code:
        raise GraphFormatError("must be float32", field="out")


def _check_delta(g, t, shape, code) -> None:
    """A GatedDelta node against its state [1, Hv, Dk, Dv] (float32)."""
    q = _dims(g, t.q, "q", 4, 1)
    v = _dims(g, t.v, "v", 4, 1)
    heads_k, dk, heads_v, dv = q[2], q[3], v[2], v[3]
    if q[0] != 1 or heads_k < 1 or heads_v % heads_k or [1, heads_v, dk, dv] != shape:
        raise GraphFormatError(f"q [1, T, {heads_k}, {dk}] and v [1, T, {heads_v}, {dv}] do "
                               f"not make the state {shape} = [1, Hv, Dk, Dv] with Hv a "
                               "multiple of Hk", field="q")
    if code != dtype_info("float32").code:
        raise GraphFormatError("a gated delta state must be float32", field="layer_id")
    want = {"k": [1, None, heads_k, dk], "g": [1, None, heads_v], "beta": [1, None, heads_v],
            "out": [1, None, heads_v, dv]}
    for field, dims in want.items():
        if _dims(g, getattr(t, field), field, len(dims), 1) != dims:
            raise GraphFormatError(f"must be {[d if d else 'T' for d in dims]}", field=field)
    for field in ("q", "k", "v", "g", "beta", "out"):
        if not _is_float(g.tensors[getattr(t, field)].dtype):
            raise GraphFormatError("must have a floating dtype", field=field)
    if g.tensors[t.out].dtype != code:
        raise GraphFormatError("must be float32", field="out")


def _check_selective(g, t, shape, code) -> None:
    """A SelectiveScan node against its state [1, D, N] (float32)."""
    channels, size = (_static(g, t.a, "a") + [None, None])[:2]
    if len(_static(g, t.a, "a")) != 2 or [1, channels, size] != shape:
        raise GraphFormatError(f"a must be [D, N] for the state {shape} = [1, D, N]", field="a")
    if code != dtype_info("float32").code:
        raise GraphFormatError("a selective scan's state must be float32", field="layer_id")
    want = {"x": [1, None, channels], "dt": [1, None, channels], "b": [1, None, size],
            "c": [1, None, size], "out": [1, None, channels]}
    for field, dims in want.items():
        if _dims(g, getattr(t, field), field, 3, 1) != dims:
            raise GraphFormatError(f"must be {[d if d else 'T' for d in dims]}", field=field)
    for field in ("d", "dt_bias"):
        if getattr(t, field) is not None and _static(g, getattr(t, field), field) != [channels]:
            raise GraphFormatError(f"must be [{channels}]", field=field)
    for field in ("x", "dt", "a", "b", "c", "d", "dt_bias", "out"):
        slot = getattr(t, field)
        if slot is not None and not _is_float(g.tensors[slot].dtype):
            raise GraphFormatError("must have a floating dtype", field=field)
    if g.tensors[t.out].dtype != code:
        raise GraphFormatError("must be float32", field="out")


# What each kind of state (op_catalogue's ``state`` fact) checks of its node.
_CHECKS = {"conv_state": _check_conv, "ssm_state": _check_ssd, "delta_state": _check_delta,
           "scan_state": _check_selective}


def _is_float(code) -> bool:
    return code is not None and is_known_code(code) and dtype_info(code).is_float


def check_states(g, limit: int) -> None:
    """Raise GraphFormatError (without the file name) for the first state fault.

    Args:
        g: the Graph record (already checked by verify_semantics and verify_layers).
        limit: the file's element limit (schema/verify_bounds.py).
    """
    known = _entries(g, limit)
    specs = op_specs()
    used = {}
    for i, node in enumerate(g.chains[0].nodes):
        code, t = node.op
        op = entry(specs[code].name)
        if not op.has(Trait.STATE):
            continue
        short = specs[code].short_name
        lid = t.layer_id
        if lid in used:
            raise GraphFormatError(f"layer_id {lid} is used by two state nodes (also node "
                                   f"{used[lid]}): each needs a state of its own", node=i,
                                   field=f"{short}.layer_id")
        if lid not in known:
            raise GraphFormatError(f"layer_id {lid} has no state in the metadata "
                                   "(metadata.states)", node=i, field=f"{short}.layer_id")
        used[lid] = i
        try:
            _CHECKS[op.state](g, t, known[lid][1], known[lid][2])
        except GraphFormatError as e:
            raise GraphFormatError(e.reason, node=i, field=f"{short}.{e.field}") from None
    for lid, (i, _, _) in known.items():
        if lid not in used:
            raise GraphFormatError(f"layer_id {lid} has no node that keeps it",
                                   field=f"metadata.states[{i}]")
