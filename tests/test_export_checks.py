"""Export reports success only for a file that loads, and each export owns its state.

The writer refuses a node missing a required field at once (not at load); ``write(...,
verify=True)`` verifies the file before it takes the target's place; two exports in one
process, one after the other or in two threads, write the same bytes as an export in a
process of its own (the state of an export lives in objects owned by that export).
"""

import os
import subprocess
import sys
import threading

import pytest
import torch
from conftest import TORCH_CHILD_ENV

from mlxgraph.exporter import ExportError, export
from mlxgraph.exporter.lowerings import lowerings
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.records import Operand
from mlxgraph.schema.writer import GraphWriter


def _tiny_writer():
    w = GraphWriter(producer="tests")
    t_val = w.add_symbol("T", 1, 8)
    x = w.add_tensor("x", "float32", (1, "T"))
    w.add_input("x", x)
    return w, x, t_val


def test_writer_refuses_a_node_missing_a_required_field():
    w, x, _ = _tiny_writer()
    y = w.add_tensor("y", "float32", (1, "T"))
    with pytest.raises(ValueError, match=r"AddNode needs field\(s\) \['b'\]"):
        w.add_node("Add", a=Operand.tensor(x), out=y)
    with pytest.raises(ValueError, match=r"NegNode needs field\(s\) \['out'\]"):
        w.add_node("Neg", x=x)
    assert w.nodes == []


def test_verified_write_keeps_no_invalid_file(tmp_path):
    w, x, _ = _tiny_writer()
    y = w.add_tensor("y", "float32", (1, "T"))
    never_written = w.add_tensor("ghost", "float32", (1, "T"))
    w.add_node("Add", a=Operand.tensor(x), b=Operand.tensor(never_written), out=y)
    w.add_output("y", y)
    target = tmp_path / "bad.mlxg"
    with pytest.raises(GraphFormatError, match="bad.mlxg.*node 0"):
        w.write(target, verify=True)
    assert list(tmp_path.iterdir()) == []  # neither the file nor its .partial
    w.write(target)  # unverified, the same graph is written (and fails at load)
    assert target.exists()


def test_export_verifies_what_it_wrote(tmp_path, tiny_hf_folder, monkeypatch):
    """A lowering that emits a node reading a slot nothing writes: export fails, no file."""
    table = lowerings()
    embedding = torch.ops.aten.embedding.default
    original = table[embedding]

    def broken(ctx, node):
        ghost = ctx.writer.add_tensor("ghost", "float32", (1,))
        out = original(ctx, node)
        ctx.emit("Add", a=Operand.tensor(ghost), b=Operand.tensor(ghost),
                 out=ctx.writer.add_tensor("sink", "float32", (1,)))
        return out

    monkeypatch.setitem(table, embedding, broken)
    out = tmp_path / "m.mlxg"
    with pytest.raises(ExportError, match="does not verify"):
        export(str(tiny_hf_folder("llama")), out, max_seq_len=16)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _export_bytes(folder, path) -> bytes:
    export(str(folder), path, max_seq_len=16)
    return path.read_bytes()


def test_exports_in_one_process_and_in_threads_match_a_fresh_process(tmp_path, tiny_hf_folder):
    folder = tiny_hf_folder("llama")
    fresh = tmp_path / "fresh.mlxg"
    subprocess.run([sys.executable, "-c", "import sys; from mlxgraph.exporter import export; "
                    "export(sys.argv[1], sys.argv[2], max_seq_len=16)", str(folder), str(fresh)],
                   check=True, capture_output=True, env={**os.environ, **TORCH_CHILD_ENV})
    want = fresh.read_bytes()
    assert _export_bytes(folder, tmp_path / "a.mlxg") == want
    assert _export_bytes(folder, tmp_path / "b.mlxg") == want  # the second in one process
    results, errors = {}, []

    def run(name):
        try:
            results[name] = _export_bytes(folder, tmp_path / f"{name}.mlxg")
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("t1", "t2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results["t1"] == want and results["t2"] == want


def test_a_graph_past_the_default_element_limit_is_kept_and_names_the_limit(tmp_path, capsys):
    """A max-T step's logits (32768 x 70000 = 2.29G elements) are past any default limit:
    the file is still valid, so the verified write keeps it and says what loading needs."""
    from synthetic_graphs import llama
    from tool_helpers import run_cli

    import mlxgraph

    writers = []
    llama(layers=1, hidden=16, heads=2, kv_heads=1, intermediate=32, vocab=70000,
          max_context=32768).write(tmp_path / "unused.mlxg", rewrite=writers.append)
    path = tmp_path / "wide.mlxg"
    needed = writers[0].write(path, verify=True)["element_limit_needed"]
    assert needed == 32768 * 70000
    with pytest.raises(GraphFormatError, match="more than the limit"):
        mlxgraph.load(path)
    logits = mlxgraph.load(path, element_limit=needed).session(capacity=8).step([[1, 2]], [0, 1])
    assert logits.shape == (1, 2, 70000)
    code, out, err = run_cli(capsys, "generate", path, "--prompt-ids", "1,2", "--max-tokens", 2,
                             "--element-limit", needed, "--json")
    assert code == 0, err

