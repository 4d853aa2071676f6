"""GraphWriter's constants: stored once per content (same dtype, shape and bytes), their
digests computed only when two could be the same or at write (schema/writer.py), and every
digest the file records is its bytes' (checked by a deep open)."""

import numpy as np
from make_golden import build_sample

from mlxgraph.schema.format import content_hash
from mlxgraph.schema.reader import open_graph


def test_equal_content_is_stored_once_and_near_misses_are_not(tmp_path):
    w = build_sample()
    rng = np.random.default_rng(0)
    big = rng.standard_normal(50_000).astype(np.float32)  # past the fingerprint's two ends
    first = w.add_constant("big", big)
    assert w.add_constant("big.again", big.copy()) == first  # another array, same bytes
    middle = big.copy()
    middle[25_000] += 1.0  # the same first and last bytes, another middle
    assert w.add_constant("big.middle", middle) != first
    assert w.add_constant("big.f16", big.astype(np.float16)) != first
    assert w.add_constant("big.2d", big.reshape(2, -1)) != first
    assert w.add_constant("empty", np.zeros(0, np.float32)) == w.add_constant(
        "empty.again", np.zeros(0, np.float32))
    # Deferred digests are filled in at write, and a deep open checks each against its bytes.
    w.write(tmp_path / "g.mlxg")
    assert all(digest == content_hash(data) if data.size else content_hash(b"")
               for _, data, digest in w.constants)
    open_graph(tmp_path / "g.mlxg", deep=True)


def test_a_constant_dropped_before_write_is_never_hashed(monkeypatch, tmp_path):
    from mlxgraph.schema import writer as writer_module

    hashed = []
    real = writer_module._digest
    monkeypatch.setattr(writer_module, "_digest", lambda d: hashed.append(d.nbytes) or real(d))
    w = build_sample()
    big = np.arange(40_000, dtype=np.float32)
    w.add_constant("unread", big)
    w.drop_unread_constants()
    w.write(tmp_path / "g.mlxg")
    assert big.nbytes not in hashed and hashed  # (the sample's own constants were)
