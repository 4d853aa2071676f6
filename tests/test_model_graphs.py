"""generate/chat/serve take a model as mlx-lm users give it (a Hugging Face folder, a Hub
repo id, a built-in name): exported once into a content-addressed cache, then run
(tools/model_graphs.py, issue 32 item 8)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from hub_cache import TINY_CODE, add_repo

from mlxgraph.tools.model_graphs import graph_key, is_model_name

PROMPT = ["--prompt", "def add(a, b):", "--max-tokens", "6"]


def _run(args, tmp_path, **env):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLXGRAPH_GRAPH_CACHE": str(tmp_path / "graphs"),
           "HF_HUB_CACHE": str(tmp_path / "hub"), **env}
    return subprocess.run([sys.executable, "-m", "mlxgraph", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)


def _graphs(tmp_path):
    return sorted((tmp_path / "graphs").glob("*.mlxg"))


def test_a_folder_is_exported_once_then_the_cached_graph_runs(tmp_path):
    folder = tmp_path / "tiny-code"
    shutil.copytree(TINY_CODE, folder)
    first = _run(["generate", str(folder), *PROMPT, "--json"], tmp_path)
    assert first.returncode == 0, first.stderr
    assert "exporting" in first.stderr and len(_graphs(tmp_path)) == 1
    doc = json.loads(first.stdout)
    assert doc["graph"] == str(_graphs(tmp_path)[0]) and doc["model"] == str(folder)
    # The same files under another name, touched: the same graph, no export.
    moved = tmp_path / "renamed"
    shutil.copytree(folder, moved)
    second = _run(["generate", str(moved), *PROMPT, "--json"], tmp_path)
    assert second.returncode == 0, second.stderr
    assert "exporting" not in second.stderr and "cached" in second.stderr
    assert json.loads(second.stdout)["token_ids"] == doc["token_ids"]
    # The graph file itself, given directly, generates the same.
    direct = _run(["generate", doc["graph"], *PROMPT, "--json"], tmp_path)
    assert json.loads(direct.stdout)["token_ids"] == doc["token_ids"]


def test_a_hub_repo_id_and_a_builtin_name_run_too(tmp_path):
    add_repo(tmp_path / "hub", "someone/tiny-code", TINY_CODE)
    by_repo = _run(["generate", "someone/tiny-code", *PROMPT, "--json"], tmp_path)
    assert by_repo.returncode == 0, by_repo.stderr
    by_name = _run(["generate", "tiny-code", *PROMPT, "--json"], tmp_path)
    assert by_name.returncode == 0, by_name.stderr
    # tiny-code's folder and the repo hold the same files: one graph.
    assert "exporting" not in by_name.stderr and len(_graphs(tmp_path)) == 1
    assert json.loads(by_name.stdout)["token_ids"] == json.loads(by_repo.stdout)["token_ids"]


def test_a_model_the_export_refuses_exits_1_and_leaves_no_graph(tmp_path):
    folder = tmp_path / "t5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "t5",
                                                    "is_encoder_decoder": True}))
    r = _run(["generate", str(folder), *PROMPT], tmp_path)
    assert r.returncode == 1
    assert "cannot export: t5: not a causal decoder" in r.stderr
    assert _graphs(tmp_path) == []


def test_a_changed_file_is_a_new_key(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(TINY_CODE, folder)
    root = tmp_path / "graphs"
    root.mkdir()
    before = graph_key(str(folder), root)
    assert graph_key(str(folder), root) == before
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    assert graph_key(str(folder), root) != before


@pytest.mark.parametrize("name, is_model", [
    ("tiny-code", True), ("tiny-llama", True), ("org/name", True), ("g.mlxg", False),
    ("./missing-folder", False),
])
def test_what_counts_as_a_model(name, is_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_model_name(name) is is_model
