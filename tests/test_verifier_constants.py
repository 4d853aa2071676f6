"""The verifier's constant checks: alignment, bounds, overlap, length, hash form, and
(deep) content hashes; constants may share bytes."""

import struct

from verifier_helpers import const_graph, fault, field_pos, patched, root

from mlxgraph.schema.format import content_hash
from mlxgraph.schema.verifier import verify_buffer


def test_constant_faults(tmp_path):
    data = const_graph(tmp_path)
    c0, c1 = root(data).Constants(0), root(data).Constants(1)
    off0 = c0.Offset()
    cases = {
        "not 64-byte aligned": patched(data, field_pos(c1, "offset"), "Q", c1.Offset() + 8),
        "outside the constant segment": patched(data, field_pos(c1, "offset"), "Q", len(data)),
        "overlap": patched(data, field_pos(c1, "offset"), "Q", off0 + 64),
        "!= 128 bytes": patched(data, field_pos(c1, "length"), "Q", 64),
        "hex": patched(
            data,
            struct.unpack_from("<I", data, field_pos(c1, "hash"))[0] + field_pos(c1, "hash") + 4,
            "B",
            ord("Z"),
        ),
    }
    for words, bad in cases.items():
        e = fault(bad)
        assert e.field.startswith("constants[") and words in e.reason, (words, e)
    assert (
        "filled by two constants"
        in fault(patched(data, field_pos(c1, "tensor"), "i", c0.Tensor())).reason
    )


def test_deep_checks_constant_hashes(tmp_path):
    data = const_graph(tmp_path)
    c1 = root(data).Constants(1)
    flipped = patched(data, c1.Offset() + 5, "B", data[c1.Offset() + 5] ^ 0x40)
    verify_buffer(flipped)                     # the cheap check does not read constant bytes
    e = fault(flipped, deep=True)
    assert e.field == "constants[1].hash" and "do not match" in e.reason


def test_constants_may_share_an_offset(tmp_path):
    """Two constants pointing at the same bytes (same offset) are fine, also deep."""
    data = const_graph(tmp_path, same_shape=True)
    c0, c1 = root(data).Constants(0), root(data).Constants(1)
    shared = patched(data, field_pos(c1, "offset"), "Q", c0.Offset())
    hash_at = field_pos(c1, "hash")
    hash_at += struct.unpack_from("<I", shared, hash_at)[0] + 4
    shared = shared[:hash_at] + c0.Hash() + shared[hash_at + 32:]
    verify_buffer(shared, deep=True)
    assert (
        content_hash(memoryview(shared)[c0.Offset() : c0.Offset() + c0.Length()])
        == c0.Hash().decode()
    )
