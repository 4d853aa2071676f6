"""The graph-file verifier: good files pass, each kind of fault is caught and located.

Files are built with the real GraphWriter; faults the writer cannot express are patched
into the written bytes at positions found through the generated bindings.
"""

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import flatbuffers
import numpy as np
import pytest

from mlxgraph.generated import mlxgraph_generated as fb
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.format import FORMAT_MAJOR, FORMAT_MINOR, align_up
from mlxgraph.schema.reader import open_graph
from mlxgraph.schema.records import LayerCacheInfo, Operand, Provenance
from mlxgraph.schema.spec import load_schema, op_codes
from mlxgraph.schema.verifier import peek_version, verify_buffer, verify_report
from mlxgraph.schema.verify_plans import table_plans
from mlxgraph.schema.verify_structure import Walker
from mlxgraph.schema.writer import GraphWriter, content_hash

sys.path.insert(0, str(Path(__file__).parent))
from make_golden import build_sample  # noqa: E402

CLI = str(Path(sys.executable).with_name("mlxgraph"))


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
    return w, {"T": t_val, "tokens": tok, "embed": emb, "x": x, "y": y}


def written(w, tmp_path, name="g.mlxg") -> bytes:
    path = tmp_path / name
    w.write(path)
    return path.read_bytes()


def fault(data, path=None, deep=False) -> GraphFormatError:
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
    b = bytearray(data)
    struct.pack_into("<" + fmt, b, pos, value)
    return bytes(b)


def root(data):
    return fb.Graph.GetRootAs(data, 0)


# ---------------------------------------------------------------- good files
def test_good_files_are_valid(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    r = verify_report(data, deep=True)
    assert (r.format_version, r.nodes, r.constants, r.bytes) == (f"{FORMAT_MAJOR}.{FORMAT_MINOR}", 2, 1, len(data))
    sample = written(build_sample(), tmp_path, "sample.mlxg")
    r = verify_report(sample, deep=True)
    assert (r.nodes, r.constants) == (24, 5)
    g = open_graph(tmp_path / "sample.mlxg", deep=True)
    assert g.nodes[12].fields["out_dtype"] is None and g.nodes[13].fields["out_dtype"] == 1   # null out_dtype is allowed (q's dtype)


def test_version_peek_and_mmap_input(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    assert peek_version(data) == (FORMAT_MAJOR, FORMAT_MINOR)
    assert peek_version(b"garbage!") is None
    g = open_graph(tmp_path / "g.mlxg")            # the reader maps the file and verifies it
    assert g.inputs == {"tokens": 0}


# ---------------------------------------------------------------- node faults
def test_missing_null_scalar_names_node_and_field(tmp_path):
    w = build_sample()
    rec = next(n for n in w.nodes if n.op == "UpdateAndAttendNode")
    del rec.fields["scale"]
    e = fault(written(w, tmp_path), path="f.mlxg")
    assert (e.node, e.field) == (12, "UpdateAndAttendNode.scale")
    assert "required field is missing" in str(e) and str(e).startswith("f.mlxg: node 12:")


def test_slot_out_of_range(tmp_path):
    w, s = base()
    w.add_node("Silu", x=s["y"], out=99)
    e = fault(written(w, tmp_path))
    assert (e.node, e.field) == (2, "SiluNode.out") and "tensor slot 99 out of range" in e.reason


def test_operand_slot_out_of_range_and_negative(tmp_path):
    w, s = base()
    w.add_node("Add", a=Operand.tensor(s["y"]), b=Operand.tensor(-1), out=s["x"])
    e = fault(written(w, tmp_path))
    assert (e.node, e.field) == (2, "AddNode.b") and "tensor slot -1" in e.reason


def test_input_read_before_defined(tmp_path):
    w, s = base()
    later = w.add_tensor("later", "float32", (1, "T", 8))
    w.add_node("Silu", x=later, out=s["y"])
    w.add_node("Neg", x=s["y"], out=later)
    e = fault(written(w, tmp_path))
    assert (e.node, e.field) == (2, "SiluNode.x") and "read before anything defines it" in e.reason


def test_value_slot_read_before_defined(tmp_path):
    w, s = base()
    n = w.add_value("n")
    out = w.add_tensor("r", "float32", (1, None, 8))
    w.add_node("Reshape", x=s["y"], out=out, shape=[Operand.literal(1), Operand.value(n), Operand.literal(8)])
    w.add_node("SymSize", x=s["tokens"], axis=1, out=n)
    e = fault(written(w, tmp_path))
    assert (e.node, e.field) == (2, "ReshapeNode.shape[1]") and "value slot 1" in e.reason


def test_value_out_defines_value_slot(tmp_path):
    w, s = base()
    n = w.add_value("n")
    w.add_node("SymSize", x=s["tokens"], axis=1, out=n)
    out = w.add_tensor("r", "float32", (1, None, 8))
    w.add_node("Reshape", x=s["y"], out=out, shape=[Operand.literal(1), Operand.value(n), Operand.literal(8)])
    verify_buffer(written(w, tmp_path))


def test_vector_slot_fields(tmp_path):
    w, s = base()
    cat = w.add_tensor("cat", "float32", (1, "T", 16))
    w.add_node("Concat", inputs=[s["x"], s["y"], 42], out=cat, axis=-1)
    e = fault(written(w, tmp_path))
    assert (e.node, e.field) == (2, "ConcatNode.inputs[2]")


def test_bad_literals(tmp_path):
    w, s = base()
    w.add_node("Add", a=Operand.tensor(s["y"]), b=Operand("int", -1, 1.5), out=s["x"])
    assert fault(written(w, tmp_path)).field == "AddNode.b"
    w, s = base()
    w.add_node("Add", a=Operand.tensor(s["y"]), b=Operand("bool", -1, 3.0), out=s["x"])
    assert "not 0 or 1" in fault(written(w, tmp_path)).reason


def test_output_never_defined(tmp_path):
    w, s = base()
    never = w.add_tensor("never", "float32", (1,))
    w.add_output("never", never)
    e = fault(written(w, tmp_path))
    assert e.field == "outputs" and "'never'" in e.reason


def test_duplicate_io_names_and_input_constant(tmp_path):
    w, s = base()
    w.add_output("y", s["x"])
    assert "appears twice" in fault(written(w, tmp_path)).reason
    w, s = base()
    w.add_input("weights", s["embed"])
    assert "both a graph input and a constant" in fault(written(w, tmp_path)).reason


def test_unknown_symbol_in_shape(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    dim_pos = root(data).Tensors(0).Shape(1)._tab.Pos
    e = fault(patched(data, dim_pos + 8, "i", 5))
    assert e.field == "tensors[0].shape[1]" and "1 symbols" in e.reason


# ---------------------------------------------------------------- header, version, codes
def test_identifier_and_short_files(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    assert "identifier" in fault(data[:4] + b"XXXX" + data[8:]).reason
    assert "too short" in fault(b"MLX").reason
    assert "too short" in fault(b"").reason


def test_newer_major_version_names_needed_format(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    e = fault(patched(data, field_pos(root(data), "version_major"), "H", FORMAT_MAJOR + 1))
    assert f"format {FORMAT_MAJOR + 1}.{FORMAT_MINOR} is newer" in e.reason
    assert f"reads format {FORMAT_MAJOR + 1}.x, is needed" in e.reason


def test_unknown_op_code(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    node = root(data).Chains(0).Nodes(1)
    bad = patched(data, field_pos(node, "op", union_type=True), "B", 200)
    e = fault(bad)
    assert e.node == 1 and "op code 200 unknown" in e.reason
    newer = patched(bad, field_pos(root(bad), "version_minor"), "H", FORMAT_MINOR + 1)
    e = fault(newer)
    assert e.reason == (f"op code 200 unknown to this mlxgraph (format {FORMAT_MAJOR}.{FORMAT_MINOR}); the file "
                        f"was written by format {FORMAT_MAJOR}.{FORMAT_MINOR + 1}: a newer mlxgraph is needed")


def test_unknown_dtype_code(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    e = fault(patched(data, field_pos(root(data).Tensors(1), "dtype"), "b", 99))
    assert e.field == "tensors[1].dtype" and "dtype code 99 unknown" in e.reason


def test_null_union_type(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    e = fault(patched(data, field_pos(root(data).Chains(0).Nodes(0), "op", union_type=True), "B", 0))
    assert (e.node, e.field) == (0, "op") and "missing" in e.reason


# ---------------------------------------------------------------- structure
def test_truncated_and_trailing_bytes(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    for n in (7, 40, len(data) // 2, len(data) - 1):
        fault(data[:n])
    assert "truncated" in fault(data[:-1]).reason
    assert "extra bytes" in fault(data + b"\0").reason


def test_huge_vector_count_is_checked_before_use(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    g = root(data)
    vec = g._tab.Vector(g._tab.Offset(4 + 2 * 4)) - 4   # Graph.tensors' length field
    for count in (0xFFFFFFFF, 0x7FFFFFFF, 1 << 28):
        t0 = time.perf_counter()
        e = fault(patched(data, vec, "I", count))
        assert time.perf_counter() - t0 < 0.1 and e.field == "tensors" and "claims" in e.reason


def test_bad_offsets_and_unterminated_string(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    g = root(data)
    producer = field_pos(g, "producer")
    assert "outside" in fault(patched(data, producer, "I", 0x7FFFFFF0)).reason
    string_at = producer + struct.unpack_from("<I", data, producer)[0]
    n = struct.unpack_from("<I", data, string_at)[0]
    assert "NUL" in fault(patched(data, string_at + 4 + n, "B", 65)).reason


def test_shared_subobjects_do_not_blow_up(tmp_path):
    """chains = 4000 offsets to one chain of 4000 nodes: 16M visits if walked naively."""
    n = 4000
    b = flatbuffers.Builder(1 << 16)

    def graph(segment):
        b.Clear()
        fb.NegNodeStart(b)
        fb.NegNodeAddX(b, 0)
        fb.NegNodeAddOut(b, 0)
        neg = fb.NegNodeEnd(b)
        fb.NodeStart(b)
        fb.NodeAddOpType(b, op_codes()["NegNode"])
        fb.NodeAddOp(b, neg)
        node = fb.NodeEnd(b)
        fb.ChainStartNodesVector(b, n)
        for _ in range(n):
            b.PrependUOffsetTRelative(node)
        nodes = b.EndVector()
        name = b.CreateString("main")
        fb.ChainStart(b)
        fb.ChainAddName(b, name)
        fb.ChainAddNodes(b, nodes)
        chain = fb.ChainEnd(b)
        fb.GraphStartChainsVector(b, n)
        for _ in range(n):
            b.PrependUOffsetTRelative(chain)
        chains = b.EndVector()
        sname = b.CreateString("x")
        fb.TensorSlotStartShapeVector(b, 0)
        shape = b.EndVector()
        fb.TensorSlotStart(b)
        fb.TensorSlotAddName(b, sname)
        fb.TensorSlotAddDtype(b, 0)
        fb.TensorSlotAddShape(b, shape)
        slot = fb.TensorSlotEnd(b)
        fb.GraphStartTensorsVector(b, 1)
        b.PrependUOffsetTRelative(slot)
        tensors = b.EndVector()
        iname = b.CreateString("x")
        fb.IOSpecStart(b)
        fb.IOSpecAddName(b, iname)
        fb.IOSpecAddTensor(b, 0)
        io = fb.IOSpecEnd(b)
        vecs = []
        for start in (fb.GraphStartInputsVector, fb.GraphStartOutputsVector):
            start(b, 1)
            b.PrependUOffsetTRelative(io)
            vecs.append(b.EndVector())
        fb.GraphStart(b)
        fb.GraphAddVersionMajor(b, FORMAT_MAJOR)
        fb.GraphAddVersionMinor(b, FORMAT_MINOR)
        fb.GraphAddTensors(b, tensors)
        fb.GraphAddInputs(b, vecs[0])
        fb.GraphAddOutputs(b, vecs[1])
        fb.GraphAddChains(b, chains)
        fb.GraphAddSegmentOffset(b, segment)
        fb.GraphAddSegmentLength(b, 0)
        b.Finish(fb.GraphEnd(b), file_identifier=b"MLXG")
        return bytes(b.Output())

    probe = graph(1 << 40)
    data = graph(align_up(len(probe)))
    data += b"\0" * (align_up(len(data)) - len(data))
    t0 = time.perf_counter()
    e = fault(data)
    assert time.perf_counter() - t0 < 1.0 and "more objects" in e.reason


def test_newer_minor_table_with_extra_fields_reads():
    """A vtable longer than this schema knows (fields appended later) is fine."""
    b = flatbuffers.Builder(64)
    key = b.CreateString("k")
    b.StartObject(3)                   # KeyValue has 2 fields; a newer one has 3
    b.PrependUOffsetTRelativeSlot(0, key, 0)
    b.PrependInt32Slot(2, 7, 0)
    b.Finish(b.EndObject())
    data = bytes(b.Output())
    walker = Walker(data, len(data), None)
    kv = walker.table(walker.root(), table_plans()["KeyValue"])
    assert kv.key == b"k" and kv.value is None


# ---------------------------------------------------------------- constants
def _const_graph(tmp_path, same_shape=False):
    w, s = base()
    shape = (10, 8) if same_shape else (4, 8)
    other = w.add_constant("other", np.full(shape, 3, np.float32))
    out = w.add_tensor("z", "float32", shape)
    w.add_node("Neg", x=other, out=out)
    w.add_output("z", out)
    return written(w, tmp_path)


def test_constant_faults(tmp_path):
    data = _const_graph(tmp_path)
    c0, c1 = root(data).Constants(0), root(data).Constants(1)
    off0 = c0.Offset()
    cases = {
        "not 64-byte aligned": patched(data, field_pos(c1, "offset"), "Q", c1.Offset() + 8),
        "outside the constant segment": patched(data, field_pos(c1, "offset"), "Q", len(data)),
        "overlap": patched(data, field_pos(c1, "offset"), "Q", off0 + 64),
        "!= 128 bytes": patched(data, field_pos(c1, "length"), "Q", 64),
        "hex": patched(data, struct.unpack_from("<I", data, field_pos(c1, "hash"))[0] + field_pos(c1, "hash") + 4,
                       "B", ord("Z")),
    }
    for words, bad in cases.items():
        e = fault(bad)
        assert e.field.startswith("constants[") and words in e.reason, (words, e)
    assert "filled by two constants" in fault(patched(data, field_pos(c1, "tensor"), "i", c0.Tensor())).reason


def test_deep_checks_constant_hashes(tmp_path):
    data = _const_graph(tmp_path)
    c1 = root(data).Constants(1)
    flipped = patched(data, c1.Offset() + 5, "B", data[c1.Offset() + 5] ^ 0x40)
    verify_buffer(flipped)                     # the cheap check does not read constant bytes
    e = fault(flipped, deep=True)
    assert e.field == "constants[1].hash" and "do not match" in e.reason


def test_constants_may_share_an_offset(tmp_path):
    """Two constants pointing at the same bytes (same offset) are fine, also deep."""
    data = _const_graph(tmp_path, same_shape=True)
    c0, c1 = root(data).Constants(0), root(data).Constants(1)
    shared = patched(data, field_pos(c1, "offset"), "Q", c0.Offset())
    hash_at = field_pos(c1, "hash")
    hash_at += struct.unpack_from("<I", shared, hash_at)[0] + 4
    shared = shared[:hash_at] + c0.Hash() + shared[hash_at + 32:]
    verify_buffer(shared, deep=True)
    assert content_hash(memoryview(shared)[c0.Offset():c0.Offset() + c0.Length()]) == c0.Hash().decode()


def test_errors_through_open_graph_name_the_file(tmp_path):
    w, s = base()
    w.add_node("Silu", x=77, out=s["y"])
    w.write(tmp_path / "bad.mlxg")
    with pytest.raises(GraphFormatError, match=r"bad\.mlxg: node 2: field SiluNode\.x: tensor slot 77"):
        open_graph(tmp_path / "bad.mlxg")


# ---------------------------------------------------------------- speed
def _layered(layers: int) -> GraphWriter:
    """A llama-shaped chain of ``layers`` blocks (~22 nodes each), tiny constants."""
    w = GraphWriter()
    t_val = w.add_symbol("T", 1, 4096)
    x = w.add_tensor("tokens", "int32", (1, "T"))
    pos = w.add_tensor("positions", "int32", ("T", 1))
    w.add_input("tokens", x)
    w.add_input("positions", pos)
    emb = w.add_constant("embed", np.zeros((16, 8), np.float16))
    h = w.add_tensor("h", "float16", (1, "T", 8))
    w.add_node("Embedding", weight=emb, indices=x, out=h)
    for layer in range(layers):
        def t(name, shape=(1, "T", 8), layer=layer):
            return w.add_tensor(f"layers.{layer}.{name}", "float16", shape)

        prov = Provenance("node", f"model.layers.{layer}", "aten.op.default")
        weight = w.add_constant(f"layers.{layer}.w", np.full((8, 8), layer, np.float16))
        heads = []
        for name in "qkv":
            lin, r, p = t(name), t(name + "r", (1, "T", 2, 4)), t(name + "p", (1, 2, "T", 4))
            w.add_node("Linear", prov, x=h, weight=weight, out=lin)
            w.add_node("Reshape", prov, x=lin, out=r,
                       shape=[Operand.literal(1), Operand.value(t_val), Operand.literal(2), Operand.literal(4)])
            w.add_node("Permute", prov, x=r, out=p, perm=[0, 2, 1, 3])
            heads.append(p)
        att = t("att", (1, 2, "T", 4))
        w.add_node("UpdateAndAttend", prov, q=heads[0], k=heads[1], v=heads[2], position=pos, out=att,
                   layer_id=layer, scale=0.5)
        prev = att
        for op in ("Silu", "Neg", "Exp", "Sigmoid", "Tanh", "Abs", "Sqrt", "Rsqrt", "Sin", "Cos", "Log"):
            nxt = t(op.lower(), (1, 2, "T", 4))
            w.add_node(op, prov, x=prev, out=nxt)
            prev = nxt
        b = t("b", (1, "T", 8))
        w.add_node("Reshape", prov, x=prev, out=b, shape=[Operand.literal(1), Operand.value(t_val), Operand.literal(8)])
        h2 = t("h2")
        w.add_node("Add", prov, a=Operand.tensor(h), b=Operand.tensor(b), out=h2)
        h = h2
        w.metadata.layers += (LayerCacheInfo(layer, 2, 4, 4, 0),)
    w.add_output("h", h)
    return w


def test_thousands_of_nodes_verify_well_under_a_second(tmp_path):
    w = _layered(150)
    assert len(w.nodes) > 3000 and len(w.tensors) > 3000
    w.write(tmp_path / "big.mlxg")
    data = (tmp_path / "big.mlxg").read_bytes()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        verify_buffer(data)
        times.append(time.perf_counter() - t0)
    assert min(times) < 0.5, times


# ---------------------------------------------------------------- command line
def _cli(*args):
    return subprocess.run([CLI, "verify", *map(str, args)], capture_output=True, text=True, timeout=120)


def test_cli_valid_invalid_unreadable(tmp_path):
    w, _ = base()
    good = tmp_path / "good.mlxg"
    w.write(good)
    r = _cli(good)
    assert r.returncode == 0 and r.stdout.startswith(f"{good}: valid (format {FORMAT_MAJOR}.{FORMAT_MINOR}, 2 nodes, 1 constants, ")
    assert r.stdout.rstrip().endswith(" MB)")
    bad = tmp_path / "bad.mlxg"
    bad.write_bytes(good.read_bytes()[:-100])
    for args in ((bad,), (bad, "--deep")):
        r = _cli(*args)
        assert r.returncode == 1 and r.stdout == ""
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{bad}: invalid: ") and "Traceback" not in r.stderr
    r = _cli(tmp_path / "missing.mlxg")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "missing.mlxg" in r.stderr


def test_cli_deep_and_json(tmp_path):
    data = _const_graph(tmp_path)
    c1 = root(data).Constants(1)
    path = tmp_path / "flipped.mlxg"
    path.write_bytes(patched(data, c1.Offset(), "B", data[c1.Offset()] ^ 1))
    assert _cli(path).returncode == 0
    r = _cli(path, "--deep", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["valid"] is False and doc["format_version"] == f"{FORMAT_MAJOR}.{FORMAT_MINOR}"
    assert doc["error"]["field"] == "constants[1].hash"
    good = tmp_path / "g.mlxg"
    r = _cli(good, "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["valid"] and doc["nodes"] == 3 and doc["format_version"] == f"{FORMAT_MAJOR}.{FORMAT_MINOR}"
