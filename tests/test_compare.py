"""`mlxgraph compare`: runs two graphs and names the first node whose outputs diverge."""

import json

import numpy as np
import pytest
import synthetic_graphs as synthetic
from tool_helpers import exported_tiny_llama

from mlxgraph.schema.format import format_version
from mlxgraph.schema.reader import open_graph
from mlxgraph.schema.records import Operand
from mlxgraph.schema.spec import op_spec
from mlxgraph.tools.cli import main

PROMPT = "5,9,12,7"


def compare(capsys, a, b, *extra):
    code = main(
        ["compare", str(a), str(b), "--prompt-ids", PROMPT, "--steps", "3", "--json", *extra]
    )
    out, err = capsys.readouterr()
    assert err == ""
    return code, json.loads(out)


def constant_index(graph, name) -> int:
    """The index of the constant filling the tensor slot called ``name``."""
    return next(i for i, c in enumerate(graph.constants) if graph.tensors[c.tensor].name == name)


def corrupt_constant(src, dst, name, delta=0.5, count=16):
    """Copy ``src`` to ``dst`` with ``count`` float32 values of constant ``name`` moved by
    ``delta``; returns the index of the first node that reads it."""
    g = open_graph(src)
    c = g.constants[constant_index(g, name)]
    data = bytearray(src.read_bytes())
    vals = np.frombuffer(data, dtype="<f4", count=count, offset=c.offset).copy() + delta
    data[c.offset:c.offset + 4 * count] = vals.tobytes()
    dst.write_bytes(bytes(data))
    return next(i for i, n in enumerate(g.nodes) if c.tensor in tensor_inputs(n))


def tensor_inputs(node) -> set:
    """The tensor slots a node reads, from the schema's field model."""
    slots = set()
    for f in op_spec(node.op).inputs:
        v = node.fields.get(f.name)
        for x in (v if isinstance(v, list) else [v]):
            if isinstance(x, Operand):
                if x.kind == "tensor":
                    slots.add(x.index)
            elif x is not None:
                slots.add(x)
    return slots


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    spec = synthetic.llama(layers=2, decomposed=True)
    paths = {"a": d / "a.mlxg", "renumbered": d / "r.mlxg", "half": d / "h.mlxg"}
    spec.write(paths["a"])
    spec.write(paths["renumbered"], order_seed=4)
    synthetic.llama(layers=2, decomposed=True, dtype="float16").write(paths["half"])
    return spec, paths, d


def test_same_graph_no_divergence(capsys, graphs):
    _, p, _ = graphs
    code, doc = compare(capsys, p["a"], p["renumbered"])
    assert code == 0 and doc["diverged"] is False and doc["first_divergent"] is None
    assert doc["format_version"] == {"a": format_version(), "b": format_version()}
    assert doc["aligned"] == len(doc["nodes"]) and doc["unmatched"] == {"a": [], "b": []}
    assert all(n["max_abs"] == 0 for n in doc["nodes"])  # a renumbering computes the same bits
    assert doc["tokens"]["a"] == doc["tokens"]["b"] and len(doc["tokens"]["a"]) == 4


def test_wrong_constant_caught_at_its_first_user(capsys, graphs):
    _, p, d = graphs
    bad = d / "bad.mlxg"
    first_user = corrupt_constant(p["a"], bad, "model.layers.1.mlp.up_proj.weight")
    code, doc = compare(capsys, p["a"], bad)
    assert code == 1 and doc["diverged"]
    f = doc["first_divergent"]
    assert (f["a"], f["op"], f["step"]) == (first_user, "Linear", 0)
    assert f["provenance"]["module_path"] == "model.layers.1.mlp.up_proj"
    assert f["max_rel"] > f["tolerance"] == 1e-4
    # everything before the first user computes exactly the same, at every step
    assert all(n["max_abs"] == 0 for n in doc["nodes"] if n["a"] < first_user)
    code = main(["compare", str(p["a"]), str(bad), "--prompt-ids", PROMPT, "--steps", "1"])
    text = capsys.readouterr()[0]
    assert (
        code == 1
        and f"FIRST DIVERGENT NODE: a{first_user} (b{first_user}) Linear at step 0" in text
    )
    assert "module model.layers.1.mlp.up_proj" in text


def test_float16_within_default_tolerance_and_first_divergence_at_tight_tolerance(capsys, graphs):
    _, p, _ = graphs
    code, doc = compare(capsys, p["a"], p["half"])
    assert code == 0 and not doc["diverged"]
    assert max(n["max_rel"] for n in doc["nodes"]) > 1e-4          # float16 did change the numbers
    code, doc = compare(capsys, p["a"], p["half"], "--rtol", "1e-4")
    assert code == 1
    f = doc["first_divergent"]
    assert (f["op"], f["step"], f["dtype_a"], f["dtype_b"]) == (
        "Embedding",
        0,
        "float32",
        "float16",
    )
    # oracle: the float16 rounding of the embedding rows the prompt selects
    ids = [int(t) for t in PROMPT.split(",")]
    ga, gb = open_graph(p["a"]), open_graph(p["half"])
    e32 = ga.constant_array(constant_index(ga, "model.embed_tokens.weight"))[ids].astype(np.float64)
    e16 = gb.constant_array(constant_index(gb, "model.embed_tokens.weight"))[ids].astype(np.float64)
    assert f["max_abs"] == pytest.approx(np.abs(e32 - e16).max(), rel=1e-6)
    assert f["max_rel"] == pytest.approx(np.abs(e32 - e16).max() / np.abs(e32).max(), rel=1e-6)


@pytest.mark.parametrize("argv, words", [
    (["--prompt-ids", "1,x"], "--prompt-ids: 'x' is not an integer"),
    (["--prompt-ids", "1,-2"], "--prompt-ids: token ids are non-negative"),
    (["--prompt-ids", "1,2", "--steps", "-1"], "--steps"),
    (["--prompt-ids", "1,64"], "outside the vocabulary"),
])
def test_bad_usage_exit_2(capsys, graphs, argv, words):
    _, p, _ = graphs
    code = main(["compare", str(p["a"]), str(p["a"]), *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and words in err and "Traceback" not in err


def test_unreadable_file_exit_2(capsys, graphs, tmp_path):
    _, p, _ = graphs
    code = main(["compare", str(p["a"]), str(tmp_path / "none.mlxg"), "--prompt-ids", "1"])
    out, err = capsys.readouterr()
    assert code == 2 and "none.mlxg" in err and "Traceback" not in err


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return exported_tiny_llama(tmp_path_factory), tmp_path_factory.mktemp("compare-exported")


def test_exported_float32_vs_float16_names_first_divergent_node(capsys, exported):
    paths, _ = exported
    code, doc = compare(capsys, paths["float32"], paths["float16"])
    assert (
        doc["unmatched"]["a"] == [] and len(doc["unmatched"]["b"]) > 0
    )  # the float16 export's casts
    # The seeded export's float16 attention exceeds the float16 tolerance (sharp softmax
    # scores amplify the rounding, docs/json-output.md): the report says where and by how much.
    assert code == 1 and doc["diverged"]
    f = doc["first_divergent"]
    assert f["op"] == "UpdateAndAttend" and f["max_rel"] > f["tolerance"] == 1e-2
    assert f["provenance"]["module_path"].startswith("model.layers.") and (
        f["dtype_a"],
        f["dtype_b"],
    ) == ("float32", "float16")
    code, doc = compare(capsys, paths["float32"], paths["float16"], "--rtol", "1e-4")
    assert code == 1
    f = doc["first_divergent"]
    assert (f["op"], f["step"], f["provenance"]["module_path"]) == (
        "Embedding",
        0,
        "model.embed_tokens",
    )
    assert 1e-4 < f["max_rel"] < 2.0 ** -11


def test_exported_wrong_constant_caught_at_its_first_user(capsys, exported):
    paths, d = exported
    bad = d / "bad.mlxg"
    first_user = corrupt_constant(paths["float32"], bad, "model.layers.2.mlp.down_proj.weight")
    code, doc = compare(capsys, paths["float32"], bad)
    assert code == 1
    f = doc["first_divergent"]
    assert (f["a"], f["op"], f["step"]) == (first_user, "Linear", 0)
    assert f["provenance"]["module_path"] == "model.layers.2.mlp.down_proj"
    assert all(n["max_abs"] == 0 for n in doc["nodes"] if n["a"] < first_user)
