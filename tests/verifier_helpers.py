"""Shared by the verifier tests: a small valid graph, and ways to write, patch and judge files.

Files are built with the real GraphWriter; faults the writer cannot express are patched
into the written bytes at positions found through the generated bindings.
"""

import struct

import numpy as np
import pytest

from mlxgraph.generated import mlxgraph_generated as fb
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.records import Operand, Provenance
from mlxgraph.schema.spec import load_schema
from mlxgraph.schema.verifier import verify_buffer
from mlxgraph.schema.writer import GraphWriter


def base():
    """A valid little graph: tokens -> embedding -> mul -> outputs; returns (writer, slots)."""
    w = GraphWriter()
    t_val = w.add_symbol("T", 1, 64)
    tok = w.add_tensor("tokens", "int32", (1, "T"))
    w.add_input("tokens", tok)
    emb = w.add_constant("embed", np.arange(80, dtype=np.float32).reshape(10, 8))
    x = w.add_tensor("x", "float32", (1, "T", 8))
    w.add_node("Embedding", Provenance("embedding", "model.embed"), weight=emb, indices=tok, out=x)
    y = w.add_tensor("y", "float32", (1, "T", 8))
    w.add_node("Mul", a=Operand.tensor(x), b=Operand.literal(2.0), out=y)
    w.add_output("y", y)
    w.metadata.vocab_size = 10
    return w, {"T": t_val, "tokens": tok, "embed": emb, "x": x, "y": y}


def written(w, tmp_path, name="g.mlxg") -> bytes:
    """Write ``w`` to ``tmp_path/name``; returns the file's bytes."""
    path = tmp_path / name
    w.write(path)
    return path.read_bytes()


def fault(data, path=None, deep=False) -> GraphFormatError:
    """The GraphFormatError verifying ``data`` raises (fails the test when it raises none)."""
    with pytest.raises(GraphFormatError) as info:
        verify_buffer(data, path=path, deep=deep)
    return info.value


def field_pos(table, name: str, union_type: bool = False) -> int:
    """Absolute byte position of a present field of a generated table object."""
    spec = load_schema().types[type(table).__name__]
    f = next(f for f in spec.fields if f.name == name)
    off = table._tab.Offset(4 + 2 * (f.slot - 1 if union_type else f.slot))
    assert off, f"{name} is absent"
    return table._tab.Pos + off


def patched(data: bytes, pos: int, fmt: str, value) -> bytes:
    """A copy of ``data`` with ``value`` packed (struct ``fmt``, little-endian) at ``pos``."""
    b = bytearray(data)
    struct.pack_into("<" + fmt, b, pos, value)
    return bytes(b)


def root(data):
    """The generated Graph table of a file's bytes."""
    return fb.Graph.GetRootAs(data, 0)



def const_graph(tmp_path, same_shape=False):
    """base() plus a second constant read by a Neg node; returns the written bytes."""
    w, s = base()
    shape = (10, 8) if same_shape else (4, 8)
    other = w.add_constant("other", np.full(shape, 3, np.float32))
    out = w.add_tensor("z", "float32", shape)
    w.add_node("Neg", x=other, out=out)
    w.add_output("z", out)
    return written(w, tmp_path)
