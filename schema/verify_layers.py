"""The attention layers a session will key its KV stores by: what ``load`` needs of them.

Every ``UpdateAndAttend`` node of the main chain names its cache by ``layer_id``; the
program builds one store per id from the metadata's geometry for it. So each id is used
by one node only (two nodes writing one cache would interleave their histories), has an
entry in ``metadata.layers``, and is an int in [0, 2**31 - 1] (the key of a saved cache
file's layer, ``layer.<id>.keys``). ``verify`` makes these checks so that no file it calls
valid is refused by ``load`` (tests/test_verify_load_parity.py). A latent-attention layer
(format 1.3, ``values_in_keys``) reads its values from its keys: its node's v is its k. A
node's ALiBi slopes (format 1.3, ``alibi_slopes``) are one finite number per query head.
"""

import math

from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.schema.spec import op_specs

MAX_LAYER_ID = 2**31 - 1


def check_layers(g) -> None:
    """Raise GraphFormatError (without the file name) for the first layer fault.

    Args:
        g: the Graph record (already checked by verify_semantics).
    """
    known = {}
    for i, lc in enumerate(g.metadata.layers or () if g.metadata is not None else ()):
        if not 0 <= lc.layer_id <= MAX_LAYER_ID:
            raise GraphFormatError(f"layer_id {lc.layer_id} is not in [0, {MAX_LAYER_ID}]",
                                   field=f"metadata.layers[{i}]")
        known[lc.layer_id] = lc
    specs = op_specs()
    used = {}
    for i, node in enumerate(g.chains[0].nodes):
        code, t = node.op
        if not entry(specs[code].name).has(Trait.ATTENTION):
            continue
        lid, field = t.layer_id, f"{specs[code].short_name}.layer_id"
        if lid in used:
            raise GraphFormatError(
                f"layer_id {lid} is used by two UpdateAndAttend nodes (also node "
                f"{used[lid]}): each attention node needs a cache of its own",
                node=i, field=field)
        if lid not in known:
            raise GraphFormatError(
                f"layer_id {lid} has no cache geometry in the metadata (metadata.layers)",
                node=i, field=field)
        used[lid] = i
        if known[lid].values_in_keys:
            _check_values_in_keys(g, t, known[lid], i, specs[code].short_name)
        if getattr(t, "alibi_slopes", None) is not None:
            _check_alibi(g, t, i, specs[code].short_name)


def _check_values_in_keys(g, t, lc, i: int, name: str) -> None:
    """A latent-attention layer (format 1.3) reads its values from its keys: the node's v
    is its k slot, and an output whose last axis is static is v_head_dim wide."""
    if t.v != t.k:
        raise GraphFormatError(
            f"layer_id {lc.layer_id} keeps its values in its keys (values_in_keys): v must be "
            f"the k slot {t.k}, got {t.v}", node=i, field=f"{name}.v")
    last = g.tensors[t.out].shape[-1] if g.tensors[t.out].shape else None
    if last is not None and last.symbol == -1 and last.size != lc.v_head_dim:
        raise GraphFormatError(
            f"layer_id {lc.layer_id}: the output's last axis is {last.size}, its values are "
            f"v_head_dim {lc.v_head_dim} wide", node=i, field=f"{name}.out")


def _check_alibi(g, t, i: int, name: str) -> None:
    """ALiBi slopes (format 1.3): finite, one per query head, so q's head axis (axis 1 of
    ``[B, Hq, T, D]``) must be static to be counted."""
    slopes, shape = t.alibi_slopes, g.tensors[t.q].shape or ()
    heads = shape[1] if len(shape) == 4 else None
    if heads is None or heads.symbol != -1 or heads.size != len(slopes):
        got = "not static" if heads is None or heads.symbol != -1 else heads.size
        raise GraphFormatError(
            f"{len(slopes)} ALiBi slopes for q's query heads ({got}): one per head",
            node=i, field=f"{name}.alibi_slopes")
    if not all(math.isfinite(x) for x in slopes):
        raise GraphFormatError("an ALiBi slope is not finite", node=i,
                               field=f"{name}.alibi_slopes")
