"""`mlxgraph diff`: alignment independent of slot numbers, and exactly the differences made."""

import copy
import json
import time

import numpy as np
import pytest
import synthetic_graphs as synthetic
from tool_helpers import exported_tiny_llama, run_cli

from mlxgraph.schema.format import format_version
from mlxgraph.schema.reader import open_graph


def diff_json(capsys, a, b, *extra):
    code, out, err = run_cli(capsys, "diff", a, b, "--json", *extra)
    assert err == ""
    return code, json.loads(out)


def node_index(spec, source):
    return next(k for k, (_, prov, _) in enumerate(spec.nodes) if prov.source == source)


def const_index(spec, name):
    return next(k for k, t in enumerate(spec.tensors) if t[0] == "const" and t[1] == name)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")
    spec = synthetic.llama(layers=3, decomposed=True)
    path = d / "a.mlxg"
    spec.write(path)
    return spec, path, d


def test_self_diff_is_empty(capsys, base):
    _, a, _ = base
    code, out, _ = run_cli(capsys, "diff", a, a)
    assert code == 0
    assert out.splitlines()[-1].startswith("same:")
    code, doc = diff_json(capsys, a, a)
    assert code == 0 and doc["same"] is True
    assert doc["format_version"] == {"a": format_version(), "b": format_version()}
    assert doc["json_version"] == 1
    assert (
        doc["nodes"] == doc["constants"] == doc["metadata"] == doc["inputs"] == doc["outputs"] == []
    )
    assert doc["summary"]["aligned"] == doc["files"]["a"]["nodes"]


def test_renumbered_slots_are_no_difference(capsys, base):
    spec, a, d = base
    b = d / "renumbered.mlxg"
    spec.write(b, order_seed=11)
    ga, gb = open_graph(a), open_graph(b)
    assert [n.fields for n in ga.nodes] != [n.fields for n in gb.nodes]  # really renumbered
    code, doc = diff_json(capsys, a, b)
    assert code == 0 and doc["same"] is True and doc["summary"]["aligned"] == len(spec.nodes)


def test_one_inserted_node_is_exactly_one_insertion(capsys, tmp_path):
    a, b = tmp_path / "a.mlxg", tmp_path / "b.mlxg"
    synthetic.llama(layers=3, decomposed=True).write(a)
    synthetic.llama(layers=3, decomposed=True, insert_extra=True).write(
        b, order_seed=5
    )  # renumbered too
    code, doc = diff_json(capsys, a, b)
    assert code == 1
    assert doc["summary"] | {"aligned": 0} == {
        "inserted": 1,
        "deleted": 0,
        "changed": 0,
        "metadata": 0,
        "inputs": 0,
        "outputs": 0,
        "constants": 0,
        "aligned": 0,
        "dtype_only": 0,
    }
    [node] = doc["nodes"]
    assert node["change"] == "inserted" and node["op"] == "Mul" and "extra_mul" in node["text"]
    assert open_graph(b).nodes[node["b"]].provenance.source == "extra_mul"
    # and the other way round it is one deletion
    code, doc = diff_json(capsys, b, a)
    assert code == 1 and [n["change"] for n in doc["nodes"]] == ["deleted"]
    code, out, _ = run_cli(capsys, "diff", a, b)
    assert out.splitlines()[-1] == "different: 1 inserted"


def test_changed_attribute_literal_and_wiring(capsys, base):
    spec, a, d = base
    s2 = copy.deepcopy(spec)
    k = node_index(s2, "l1_attend")
    op, prov, fields = s2.nodes[k]
    s2.nodes[k] = (op, prov, {**fields, "scale": 0.5})
    k2 = next(
        k for k, (op, prov, f) in enumerate(s2.nodes) if op == "Add" and prov.source == "l2_in_norm"
    )
    op, prov, fields = s2.nodes[k2]
    s2.nodes[k2] = (op, prov, {**fields, "b": 1e-6})                 # eps literal
    k3 = node_index(s2, "lm_head")
    op, prov, fields = s2.nodes[k3]
    x_before = fields["x"]
    # the head now reads the last residual, skipping the final norm
    residual = next(f["out"] for _, p, f in s2.nodes if p.source == "l2_add2")
    s2.nodes[k3] = (op, prov, {**fields, "x": residual})
    b = d / "changed.mlxg"
    s2.write(b, order_seed=2)
    code, doc = diff_json(capsys, a, b)
    assert code == 1
    assert (
        doc["summary"]["changed"] == 3
        and doc["summary"]["inserted"] == doc["summary"]["deleted"] == 0
    )
    changes = {n["a"]: n["fields"] for n in doc["nodes"]}
    assert changes[k] == [{"field": "scale", "a": 0.35355338, "b": 0.5}]
    assert changes[k2] == [{"field": "b", "a": 1e-5, "b": 1e-6}]
    [wiring] = changes[k3]
    prev = next(i for i, (_, _, f) in enumerate(spec.nodes) if f.get("out") == x_before)
    assert wiring["field"] == "x" and wiring["a"].startswith(f"node {prev} Mul.out")
    assert wiring["b"].startswith(f"node {node_index(spec, 'l2_add2')} Add.out")
    assert all(n["dtype_only"] is False for n in doc["nodes"])


def test_changed_constant_with_stats(capsys, base):
    spec, a, d = base
    s2 = copy.deepcopy(spec)
    k = const_index(s2, "model.layers.2.mlp.up_proj.weight")
    kind, name, arr, dt = s2.tensors[k]
    new = arr.copy()
    new[3, 5] += 0.25
    new[7, 1] -= 0.125
    s2.tensors[k] = (kind, name, new, dt)
    b = d / "const.mlxg"
    s2.write(b, order_seed=3)
    code, doc = diff_json(capsys, a, b)
    assert code == 1 and doc["nodes"] == [] and len(doc["constants"]) == 1
    c = doc["constants"][0]
    assert c["change"] == "changed" and c["a"]["name"] == c["b"]["name"] == name
    assert c["a"]["hash"] != c["b"]["hash"]
    expect_abs = float(np.abs(new.astype(np.float64) - arr).max())
    assert c["max_abs_diff"] == pytest.approx(expect_abs, rel=1e-6)
    assert c["max_rel_diff"] == pytest.approx(expect_abs / np.abs(arr).max(), rel=1e-6)
    _, doc = diff_json(capsys, a, b, "--no-stats")
    assert "max_abs_diff" not in doc["constants"][0]


def test_metadata_and_io_differences(capsys, base):
    spec, a, d = base
    s2 = copy.deepcopy(spec)
    s2.metadata.max_context = 512
    s2.metadata.extra = {"note": "x"}
    s2.outputs = [("scores", s2.outputs[0][1])]
    b = d / "meta.mlxg"
    s2.write(b)
    code, doc = diff_json(capsys, a, b)
    assert code == 1 and doc["nodes"] == [] and doc["constants"] == []
    assert doc["metadata"] == [
        {"field": "max_context", "a": 256, "b": 512},
        {"field": "extra[note]", "a": None, "b": "x"},
    ]
    assert [(o["name"], o["change"]) for o in doc["outputs"]] == [
        ("logits", "removed"),
        ("scores", "added"),
    ]


def test_alignment_is_fast_on_thousands_of_nodes(tmp_path):
    """An inserted node plus a renumbering in ~3,100 repetitive nodes: one insertion, quickly."""
    from mlxgraph.tools.graph_diff import diff_graphs
    from mlxgraph.tools.output import open_checked

    def timed(layers):
        a, b = tmp_path / f"a{layers}.mlxg", tmp_path / f"b{layers}.mlxg"
        kw = dict(layers=layers, hidden=8, heads=2, kv_heads=1, intermediate=8, vocab=16,
                  decomposed=True)
        synthetic.llama(**kw).write(a)
        synthetic.llama(insert_extra=True, **kw).write(b, order_seed=1)
        ga, gb = open_checked(a), open_checked(b)
        best = float("inf")
        for _ in range(2):
            t0 = time.process_time()   # this process's CPU: other processes' load counts less
            doc = diff_graphs(ga, gb)
            best = min(best, time.process_time() - t0)
        assert [n["change"] for n in doc["nodes"]] == ["inserted"]
        assert doc["summary"]["aligned"] == len(ga.nodes)
        return len(ga.nodes), best

    (n_small, small), (n_big, big) = timed(8), timed(64)
    assert n_big > 3000
    # A ratio in one run, not a wall-clock bound (shared machines are noisy, by 2-3x under
    # load): eight times the nodes in about eight times the time; a quadratic alignment would
    # take ~64x, so the bound (32) separates the two with room for the noise.
    assert big / small < 32.0, (n_small, small, n_big, big)


def test_unreadable_file_exit_2(capsys, base, tmp_path):
    _, a, _ = base
    code, out, err = run_cli(capsys, "diff", a, tmp_path / "missing.mlxg")
    assert code == 2 and out == "" and "missing.mlxg" in err and "Traceback" not in err


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return exported_tiny_llama(tmp_path_factory)


def test_float32_vs_float16_export_is_dtypes_and_constants_only(capsys, exported):
    a, b = exported["float32"], exported["float16"]
    code, doc = diff_json(capsys, a, b)
    assert code == 1
    s = doc["summary"]
    assert s["deleted"] == 0 and s["changed"] > 0
    # every node difference is a cast or a change of dtypes alone
    assert s["dtype_only"] == s["inserted"] + s["changed"]
    for n in doc["nodes"]:
        assert n["op"] == "Cast" if n["change"] == "inserted" else all(
            f["field"].endswith("dtype") for f in n["fields"]), n
    assert doc["inputs"] == []
    assert [(o["name"], o["fields"]) for o in doc["outputs"]] == [
        ("logits", [{"field": "dtype", "a": "float32", "b": "float16"}])
    ]
    assert all(m["a"] == "float32" and m["b"] == "float16" for m in doc["metadata"]), doc[
        "metadata"
    ]
    # every constant changed dtype, kept its name and shape, and moved by float16 rounding only
    ga, gb = open_graph(a), open_graph(b)
    assert len(doc["constants"]) == len(ga.constants)
    for c in doc["constants"]:
        assert (
            c["change"] == "changed"
            and c["a"]["name"] == c["b"]["name"]
            and c["a"]["shape"] == c["b"]["shape"]
        )
        assert (c["a"]["dtype"], c["b"]["dtype"]) == ("float32", "float16")
        x = ga.constant_array(c["a"]["index"]).astype(np.float64)
        y = gb.constant_array(c["b"]["index"]).astype(np.float64)
        assert c["max_abs_diff"] == pytest.approx(np.abs(x - y).max(), rel=1e-5)
        assert c["max_rel_diff"] < 2.0 ** -11
