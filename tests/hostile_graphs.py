"""Small crafted graph files, each one way a stranger's file could attack a reader.

Every builder returns the file's bytes, written by the real GraphWriter (what a hostile
producer could write too). tests/test_hostile_files.py asserts each one ends in a
documented error; the runtime ones run in a subprocess (run_case) so that a regression
that crashes the process fails one test instead of killing the suite.
"""

import tempfile
from pathlib import Path

import numpy as np

from mlxgraph.schema.records import Operand
from mlxgraph.schema.writer import GraphWriter


def _start(vocab=4, rows=4, max_t=8):
    """tokens [1, T] -> (caller adds nodes); a ``rows`` x 2 float table as a constant."""
    w = GraphWriter(producer="hostile")
    t = w.add_symbol("T", 1, max_t)
    tok = w.add_tensor("tokens", "int32", (1, "T"))
    w.add_input("tokens", tok)
    table = w.add_constant("table", np.arange(rows * 2, dtype=np.float32).reshape(rows, 2))
    w.metadata.vocab_size = vocab
    return w, t, tok, table


def _finish(w, out) -> bytes:
    w.add_output("logits", out)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.mlxg"
        w.write(path)
        return path.read_bytes()


def embedding_past_table() -> bytes:
    """Embedding indices computed in the graph: tokens + 4 on a 4-row table."""
    w, t, tok, table = _start()
    shifted = w.add_tensor("shifted", "int32", (1, "T"))
    w.add_node("Add", a=Operand.tensor(tok), b=Operand.literal(4), out=shifted)
    out = w.add_tensor("x", "float32", (1, "T", 2))
    w.add_node("Embedding", weight=table, indices=shifted, out=out)
    return _finish(w, out)


def embedding_of_tokens(vocab=4, rows=4) -> bytes:
    """The tokens feed a ``rows``-row embedding; the metadata claims ``vocab``."""
    w, t, tok, table = _start(vocab=vocab, rows=rows)
    out = w.add_tensor("x", "float32", (1, "T", 2))
    w.add_node("Embedding", weight=table, indices=tok, out=out)
    return _finish(w, out)


def gather_past_axis() -> bytes:
    """Gather along axis 1 with indices tokens * 3 (past a 2-wide axis for any id >= 1)."""
    w, t, tok, table = _start()
    x = w.add_tensor("x", "float32", (1, "T", 2))
    w.add_node("Embedding", weight=table, indices=tok, out=x)
    idx3 = w.add_tensor("idx", "int32", (1, "T"))
    w.add_node("Mul", a=Operand.tensor(tok), b=Operand.literal(3), out=idx3)
    idx = w.add_tensor("idx3", "int32", (1, "T", 1))
    w.add_node("Unsqueeze", x=idx3, out=idx, axis=2)
    out = w.add_tensor("g", "float32", (1, "T", 1))
    w.add_node("Gather", x=x, indices=idx, out=out, axis=2)
    return _finish(w, out)


def select_past_axis() -> bytes:
    """Select on axis 0 of the table with a tensor index (a token id + 10)."""
    w, t, tok, table = _start()
    first = w.add_tensor("first", "int32", ())
    flat = w.add_tensor("flat", "int32", ("T",))
    w.add_node("Select", x=tok, out=flat, axis=0, index=Operand.literal(0))
    w.add_node("Select", x=flat, out=first, axis=0, index=Operand.literal(0))
    far = w.add_tensor("far", "int32", ())
    w.add_node("Add", a=Operand.tensor(first), b=Operand.literal(10), out=far)
    out = w.add_tensor("row", "float32", (2,))
    w.add_node("Select", x=table, out=out, axis=0, index=Operand.tensor(far))
    return _finish(w, out)


def full_of(shape) -> bytes:
    """One Full node of a literal ``shape`` (declared as [1] to hide it)."""
    w, t, tok, table = _start()
    out = w.add_tensor("f", "float32", (1,))
    w.add_node("Full", shape=[Operand.literal(s) for s in shape], out=out, value=1.0, dtype=0)
    return _finish(w, out)


def reshape_or_expand_to(op, shape) -> bytes:
    """A Reshape or Expand of the embedding to a literal ``shape`` (declared small)."""
    w, t, tok, table = _start()
    x = w.add_tensor("x", "float32", (1, "T", 2))
    w.add_node("Embedding", weight=table, indices=tok, out=x)
    out = w.add_tensor("y", "float32", (1, "T", 2))
    w.add_node(op, x=x, out=out, shape=[Operand.literal(s) for s in shape])
    return _finish(w, out)


def squarings(n=40) -> bytes:
    """``n`` chained SymArith squarings of T: a runtime integer of T ** (2 ** n)."""
    w, t, tok, table = _start()
    v = t
    for i in range(n):
        nxt = w.add_value(f"sq{i}")
        w.add_node("SymArith", op=2, a=Operand.value(v), b=Operand.value(v), out=nxt)
        v = nxt
    out = w.add_tensor("f", "float32", (1,))
    w.add_node("Full", shape=[Operand.literal(1)], out=out, value=1.0, dtype=0)
    return _finish(w, out)


def broadcast_blowup(rounds=6) -> bytes:
    """x [T] -> unsqueeze / add with itself, ``rounds`` times: T ** (2 ** rounds) elements
    while every slot declares a shape of T elements (the file lies about its shapes)."""
    w, t, tok, table = _start(max_t=64)
    x = w.add_tensor("x0", "float32", ("T",))
    cast = w.add_tensor("c", "float32", (1, "T"))
    w.add_node("Cast", x=tok, out=cast, dtype=0)
    w.add_node("Reshape", x=cast, out=x, shape=[Operand.literal(-1)])
    for i in range(rounds):
        col = w.add_tensor(f"col{i}", "float32", ("T",))
        w.add_node("Unsqueeze", x=x, out=col, axis=-1)
        nxt = w.add_tensor(f"x{i + 1}", "float32", ("T",))
        w.add_node("Add", a=Operand.tensor(col), b=Operand.tensor(x), out=nxt)
        x = nxt
    return _finish(w, x)


def constant_of_shape(shape) -> bytes:
    """A constant whose slot has ``shape`` (zero elements, so zero bytes, for (0, 2**40))."""
    w, t, tok, table = _start()
    w.add_constant("odd", np.zeros((0, 1), np.float32))
    w.tensors[-1] = (w.tensors[-1][0], w.tensors[-1][1], tuple(shape))
    return embedding_tail(w, tok, table)


def embedding_tail(w, tok, table) -> bytes:
    out = w.add_tensor("x", "float32", (1, "T", 2))
    w.add_node("Embedding", weight=table, indices=tok, out=out)
    return _finish(w, out)


def unnamed_dynamic_input() -> bytes:
    """A graph input whose dim is dynamic without a symbol."""
    w = GraphWriter(producer="hostile")
    w.add_symbol("T", 1, 8)
    tok = w.add_tensor("tokens", "int32", (1, None))
    w.add_input("tokens", tok)
    table = w.add_constant("table", np.zeros((4, 2), np.float32))
    out = w.add_tensor("x", "float32", (1, None, 2))
    w.add_node("Embedding", weight=table, indices=tok, out=out)
    w.metadata.vocab_size = 4
    return _finish(w, out)


def attribute(op, **attrs) -> bytes:
    """One node with a hostile attribute value (RmsNorm eps, UpdateAndAttend scale, ...)."""
    w, t, tok, table = _start()
    x = w.add_tensor("x", "float32", (1, "T", 2))
    w.add_node("Embedding", weight=table, indices=tok, out=x)
    out = w.add_tensor("y", "float32", (1, "T", 2))
    if op == "RmsNorm":
        w.add_node("RmsNorm", x=x, out=out, **attrs)
    elif op == "Clamp":
        w.add_node("Clamp", x=x, out=out, **attrs)
    elif op == "UpdateAndAttend":
        from mlxgraph.schema.records import LayerCacheInfo

        pos = w.add_tensor("positions", "int32", ("T",))
        w.add_input("positions", pos)
        q = w.add_tensor("q", "float32", (1, 1, "T", 2))
        w.add_node("Unsqueeze", x=x, out=q, axis=1)
        att = w.add_tensor("att", "float32", (1, 1, "T", 2))
        w.add_node("UpdateAndAttend", q=q, k=q, v=q, position=pos, out=att, layer_id=0, **attrs)
        w.add_node("Squeeze", x=att, out=out, axes=[1])
        w.metadata.layers = (LayerCacheInfo(0, 1, 2, 2, 0),)
    return _finish(w, out)


def writes_fixed_slot(which) -> bytes:
    """A node whose output slot is the table constant's or the tokens input's."""
    w, t, tok, table = _start()
    x = w.add_tensor("x", "float32", (1, "T", 2))
    w.add_node("Embedding", weight=table, indices=tok, out=x)
    w.add_node("Neg", x=x, out=table if which == "constant" else tok)
    return _finish(w, x)
