"""`mlxgraph inspect`: summary, --nodes canonical text, --constants, --json, bad files."""

import hashlib
import json
import re
from collections import Counter

import numpy as np
import pytest
import synthetic_graphs as synthetic
from tool_helpers import run_cli

from mlxgraph.schema.format import format_version
from mlxgraph.schema.writer import GraphWriter


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    spec = synthetic.llama(layers=2, decomposed=True)
    a, b = d / "a.mlxg", d / "a_renumbered.mlxg"
    spec.write(a)
    spec.write(b, order_seed=7)
    return spec, a, b


def test_summary_text(capsys, graphs):
    spec, a, _ = graphs
    code, out, err = run_cli(capsys, "inspect", a)
    assert code == 0 and err == ""
    assert re.search(
        rf"^format\s+{re.escape(format_version())}\s+producer mlxgraph-synthetic", out, re.M
    )
    assert re.search(
        r"^model\s+llama\s+layers 2\s+hidden 32\s+vocab 64\s+max context 256\s+eos \[63\]",
        out,
        re.M,
    )
    assert "layers 0-1: kv_heads 2 head_dim 8 v_head_dim 8 full" in out
    assert "T in [1, 256]" in out
    assert re.search(r"^inputs\s+tokens int32\[1, T\]\s+positions int32\[T\]", out, re.M)
    assert re.search(r"^outputs\s+logits float32\[1, T, 64\]", out, re.M)
    # the op histogram against the builder's own node list
    for op, n in Counter(op for op, _, _ in spec.nodes).items():
        assert re.search(rf"\b{op} {n}\b", out), op
    assert len(out.splitlines()) <= 25  # one screen


def test_json_summary(capsys, graphs):
    spec, a, _ = graphs
    code, out, _ = run_cli(capsys, "inspect", a, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["format_version"] == format_version() and doc["json_version"] == 1
    consts = [t for t in spec.tensors if t[0] == "const"]
    arrays = {name: arr for _, name, arr, _ in consts}
    assert doc["counts"] == {
        "tensors": len(spec.tensors),
        "values": 1,
        "symbols": 1,
        "constants": len(consts),
        "nodes": len(spec.nodes),
        "chains": 1,
    }
    assert doc["ops"] == dict(Counter(op for op, _, _ in spec.nodes))
    total = sum(a.nbytes for a in arrays.values())
    assert doc["constant_bytes"]["total"] == total
    assert doc["constant_bytes"]["by_dtype"] == {"float32": {"count": len(consts), "bytes": total}}
    assert doc["constant_bytes"]["duplicates"] == []
    assert doc["metadata"]["cache"] == [
        {"layers": [0, 1], "kv_heads": 2, "head_dim": 8, "v_head_dim": 8, "sliding_window": 0,
         "attention_chunk": 0, "values_in_keys": False, "alibi": False}
    ]
    assert doc["inputs"][0] == {
        "name": "tokens",
        "slot": doc["inputs"][0]["slot"],
        "dtype": "int32",
        "shape": [1, "T"],
    }
    assert "nodes" not in doc and "constants" not in doc


def test_nodes_canonical_text(capsys, graphs):
    spec, a, b = graphs
    code, out, _ = run_cli(capsys, "inspect", a, "--nodes")
    assert code == 0
    lines = out.split("nodes:\n", 1)[1].splitlines()
    assert len(lines) == len(spec.nodes)
    assert [ln.split()[1] for ln in lines] == [op for op, _, _ in spec.nodes]
    attend = next(ln for ln in lines if " UpdateAndAttend " in ln)
    assert re.match(
        r"^\d+  UpdateAndAttend  q=%\d+:l0_q_rope_y k=%\d+:l0_k_rope_y v=%\d+:l0_v_t "
        r"position=%\d+:position "
        r"-> out=%\d+:l0_attn  layer_id=0 scale=0\.35355338  # model\.layers\.0\.self_attn "
        r"l0_attend "
        r"mlxgraph\.update_and_attend\.default$",
        attend,
    ), attend
    # stable across runs, and a renumbering changes only the slot numbers
    assert run_cli(capsys, "inspect", a, "--nodes")[1] == out
    other = run_cli(capsys, "inspect", b, "--nodes")[1].split("nodes:\n", 1)[1]
    strip = re.compile(r"([%$])\d+:")
    assert other != "\n".join(lines) + "\n"
    assert strip.sub(r"\1:", other) == strip.sub(r"\1:", "\n".join(lines) + "\n")


def test_nodes_and_constants_json(capsys, graphs):
    spec, a, _ = graphs
    doc = json.loads(run_cli(capsys, "inspect", a, "--json", "--nodes", "--constants")[1])
    assert len(doc["nodes"]) == len(spec.nodes)
    emb = doc["nodes"][1]
    assert emb["op"] == "Embedding"
    assert emb["inputs"]["weight"]["name"] == "model.embed_tokens.weight"
    assert emb["inputs"]["indices"] == {
        "kind": "tensor",
        "slot": doc["inputs"][0]["slot"],
        "name": "tokens",
    }
    assert emb["provenance"] == {
        "module_path": "model.embed_tokens",
        "source": "embedding",
        "target": "aten.embedding.default",
    }
    reshape = next(n for n in doc["nodes"] if n["op"] == "Reshape")
    assert [s.get("value", s.get("name")) for s in reshape["inputs"]["shape"]] == [1, 1, "T", 8]
    arrays = {name: arr for kind, name, arr, _ in spec.tensors if kind == "const"}
    assert {c["name"] for c in doc["constants"]} == set(arrays)
    for c in doc["constants"]:
        arr = arrays[c["name"]]
        assert (c["dtype"], c["shape"], c["bytes"]) == (str(arr.dtype), list(arr.shape), arr.nbytes)
        assert (
            c["hash"]
            == hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=16).hexdigest()
        )


def test_constants_text_and_duplicates(capsys, tmp_path):
    w = GraphWriter()
    w.add_symbol("T", 1, 8)
    tok = w.add_tensor("tokens", "int32", (1, "T"))
    data = np.arange(12, dtype=np.float32)
    e1 = w.add_constant("table_a", data.reshape(3, 4))
    w.add_constant("table_b", data.reshape(4, 3))          # same bytes, another shape: a duplicate
    w.add_constant("half", data.astype(np.float16).reshape(3, 4))
    out = w.add_tensor("x", "float32", (1, "T", 4))
    w.add_node("Embedding", weight=e1, indices=tok, out=out)
    w.add_input("tokens", tok)
    w.add_output("x", out)
    w.metadata.vocab_size = 3
    path = tmp_path / "dups.mlxg"
    w.write(path)
    code, text, _ = run_cli(capsys, "inspect", path, "--constants")
    assert code == 0
    assert re.search(
        r"^duplicates\s+2x 48 B \(table_a, table_b\)\s+48 B could be shared", text, re.M
    )
    assert "float32 96 B (2)" in text and "float16 24 B (1)" in text
    assert re.search(r"^  1  table_b  float32\[4, 3\]  48  [0-9a-f]{32}$", text, re.M)
    doc = json.loads(run_cli(capsys, "inspect", path, "--json")[1])
    assert doc["constant_bytes"]["duplicate_bytes"] == 48
    assert doc["constant_bytes"]["duplicates"][0]["names"] == ["table_a", "table_b"]


@pytest.mark.parametrize("content", ["missing", "empty", "garbage", "truncated"])
def test_bad_file_exit_2(capsys, graphs, tmp_path, content):
    path = tmp_path / "bad.mlxg"
    if content == "empty":
        path.write_bytes(b"")
    elif content == "garbage":
        path.write_bytes(bytes(range(256)) * 8)
    elif content == "truncated":
        path.write_bytes(graphs[1].read_bytes()[:3000])
    code, out, err = run_cli(capsys, "inspect", path, "--json")
    assert code == 2 and out == ""
    assert str(path) in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
