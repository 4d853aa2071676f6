"""The graph-file verifier: good files pass, each kind of node, header, version and code fault
is caught and located (node index and field). Structure, constants and the command line are
in tests/test_verifier_{structure,constants}.py and tests/test_verify_cli.py.
"""

import pytest
from make_golden import build_sample
from verifier_helpers import base, fault, field_pos, patched, root, written

from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.format import FORMAT_MAJOR, FORMAT_MINOR
from mlxgraph.schema.reader import open_graph
from mlxgraph.schema.records import Operand
from mlxgraph.schema.verifier import peek_version, verify_buffer, verify_report


# ---------------------------------------------------------------- good files
def test_good_files_are_valid(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    r = verify_report(data, deep=True)
    assert (r.format_version, r.nodes, r.constants, r.bytes) == (
        f"{FORMAT_MAJOR}.{FORMAT_MINOR}",
        2,
        1,
        len(data),
    )
    sample = written(build_sample(), tmp_path, "sample.mlxg")
    r = verify_report(sample, deep=True)
    w = build_sample()
    assert (r.nodes, r.constants) == (len(w.nodes), len(w.constants)) == (63, 37)
    g = open_graph(tmp_path / "sample.mlxg", deep=True)
    assert (
        g.nodes[12].fields["out_dtype"] is None and g.nodes[13].fields["out_dtype"] == 1
    )  # null out_dtype is allowed (q's dtype)


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
    w.add_node(
        "Reshape",
        x=s["y"],
        out=out,
        shape=[Operand.literal(1), Operand.value(n), Operand.literal(8)],
    )
    w.add_node("SymSize", x=s["tokens"], axis=1, out=n)
    e = fault(written(w, tmp_path))
    assert (e.node, e.field) == (2, "ReshapeNode.shape[1]") and "value slot 1" in e.reason


def test_value_out_defines_value_slot(tmp_path):
    w, s = base()
    n = w.add_value("n")
    w.add_node("SymSize", x=s["tokens"], axis=1, out=n)
    out = w.add_tensor("r", "float32", (1, None, 8))
    w.add_node(
        "Reshape",
        x=s["y"],
        out=out,
        shape=[Operand.literal(1), Operand.value(n), Operand.literal(8)],
    )
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
    assert e.reason == (
        f"op code 200 unknown to this mlxgraph (format {FORMAT_MAJOR}.{FORMAT_MINOR}): the file "
        f"was written by a newer mlxgraph (format {FORMAT_MAJOR}.{FORMAT_MINOR + 1})"
    )


def test_unknown_dtype_code(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    e = fault(patched(data, field_pos(root(data).Tensors(1), "dtype"), "b", 99))
    assert e.field == "tensors[1].dtype" and "dtype code 99 unknown" in e.reason


def test_null_union_type(tmp_path):
    w, _ = base()
    data = written(w, tmp_path)
    e = fault(
        patched(data, field_pos(root(data).Chains(0).Nodes(0), "op", union_type=True), "B", 0)
    )
    assert (e.node, e.field) == (0, "op") and "missing" in e.reason




def test_errors_through_open_graph_name_the_file(tmp_path):
    w, s = base()
    w.add_node("Silu", x=77, out=s["y"])
    w.write(tmp_path / "bad.mlxg")
    with pytest.raises(
        GraphFormatError, match=r"bad\.mlxg: node 2: field SiluNode\.x: tensor slot 77"
    ):
        open_graph(tmp_path / "bad.mlxg")
