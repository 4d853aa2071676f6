"""diff and compare across a float graph and its quantized version: Linear pairs with
QuantizedLinear, weights are measured in dequantized space, and compare names the node
where the quantization error enters."""

import json

import numpy as np
import pytest
from synthetic_graphs import llama
from tool_helpers import run_cli

from mlxgraph.exporter.quantize import QuantizeRecipe, quantize_graph


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """(float32 graph, the same graph with q4 weights in groups of 32) of a synthetic Llama."""
    folder = tmp_path_factory.mktemp("quantized-tools")
    spec = llama(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=64, seed=3)
    spec.write(folder / "f32.mlxg")
    spec.write(folder / "q4.mlxg", rewrite=lambda w: quantize_graph(w, QuantizeRecipe("q4", 32)))
    return folder / "f32.mlxg", folder / "q4.mlxg"


def test_diff_pairs_linear_with_quantized_linear_in_dequantized_space(graphs, capsys):
    code, out, _ = run_cli(capsys, "diff", *graphs, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["summary"]["inserted"] == doc["summary"]["deleted"] == 0
    ops = [f for n in doc["nodes"] for f in n.get("fields", []) if f["field"] == "op"]
    assert {(f["a"], f["b"]) for f in ops} == {("Linear", "QuantizedLinear"),
                                                ("Embedding", "QuantizedEmbedding")}
    assert len(ops) == 2 * 7 + 1 + 1  # 7 projections per layer, the head, the embedding
    weights = [c for c in doc["constants"] if c["change"] == "changed"]
    assert len(weights) == len(ops) - 1  # the tied embedding and head share one weight
    for c in weights:
        assert c["a"]["dtype"] == "float32" and c["b"]["dtype"] == "uint32"
        # 4-bit codes in groups of 32: at most half a step (1/30 of a group's range) off.
        assert 0 < c["max_rel_diff"] <= 1 / 15, c


def test_compare_aligns_every_node_and_finds_where_the_error_enters(graphs, capsys):
    code, out, _ = run_cli(capsys, "compare", *graphs, "--prompt-ids", "1,2,3,4", "--steps", "2",
                           "--json")
    doc = json.loads(out)
    assert doc["unmatched"] == {"a": [], "b": []}
    first = doc["first_divergent"]
    assert code == 1 and first["op"] == "Embedding" and first["step"] == 0
    linear = [n for n in doc["nodes"] if n["op"] == "Linear"]
    assert linear and all(np.isfinite(n["max_rel"]) and n["max_rel"] > 0 for n in linear)
