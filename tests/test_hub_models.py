"""Hub repo ids (org/name) as users give them: resolved through huggingface_hub's cache,
offline a cached repo works and a missing one says how to fetch it (issue 32 item 8).
The cache is built locally in the Hub's own layout (tests/hub_cache.py)."""

import json
import os
import subprocess
import sys

import pytest
from hub_cache import TINY_CODE, add_repo

from mlxgraph.exporter.hub import looks_like_repo_id


def _cli(args, cache, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache),
           "HF_HOME": str(tmp_path / "hf-home")}
    return subprocess.run([sys.executable, "-m", "mlxgraph", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def test_a_cached_repo_exports_offline_with_its_tokenizer(tmp_path):
    cache = tmp_path / "hub"
    add_repo(cache, "someone/tiny-code", TINY_CODE)
    r = _cli(["export", "someone/tiny-code", "-o", "g.mlxg", "--json"], cache, tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["model"] == "someone/tiny-code" and summary["tokenizer"] == "embedded"
    r = _cli(["generate", "g.mlxg", "--prompt", "def add(a, b):", "--max-tokens", "8",
              "--json"], cache, tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stats"]["generated_tokens"] == 8


def test_a_missing_repo_offline_says_how_to_fetch_it(tmp_path):
    r = _cli(["export", "someone/not-cached", "-o", "g.mlxg"], tmp_path / "hub", tmp_path)
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if not line.startswith("[")]  # progress
    assert len(errors) == 1 and "hf download someone/not-cached" in errors[0], r.stderr
    assert not (tmp_path / "g.mlxg").exists()


@pytest.mark.parametrize("name, is_repo", [
    ("org/name", True), ("org/name@v1.0", True), ("Org-1/na.me_2", True),
    ("tiny-code", False), ("./org/name", False), ("/abs/path", False), ("a/b/c", False),
])
def test_what_counts_as_a_repo_id(name, is_repo):
    assert looks_like_repo_id(name) is is_repo


def test_an_existing_folder_wins_over_a_repo_id(tmp_path, monkeypatch):
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    monkeypatch.chdir(tmp_path)
    assert not looks_like_repo_id("org/name")
