"""The attention layers a session will key its KV stores by: what ``load`` needs of them.

Every ``UpdateAndAttend`` node of the main chain names its cache by ``layer_id``; the
program builds one store per id from the metadata's geometry for it. So each id is used
by one node only (two nodes writing one cache would interleave their histories), has an
entry in ``metadata.layers``, and is an int in [0, 2**31 - 1] (the key of a saved cache
file's layer, ``layer.<id>.keys``). ``verify`` makes these checks so that no file it calls
valid is refused by ``load`` (tests/test_verify_load_parity.py).
"""

from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.schema.spec import op_specs

MAX_LAYER_ID = 2**31 - 1


def check_layers(g) -> None:
    """Raise GraphFormatError (without the file name) for the first layer fault.

    Args:
        g: the Graph record (already checked by verify_semantics).
    """
    known = set()
    for i, lc in enumerate(g.metadata.layers or () if g.metadata is not None else ()):
        if not 0 <= lc.layer_id <= MAX_LAYER_ID:
            raise GraphFormatError(f"layer_id {lc.layer_id} is not in [0, {MAX_LAYER_ID}]",
                                   field=f"metadata.layers[{i}]")
        known.add(lc.layer_id)
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
