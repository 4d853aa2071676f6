"""Docs that run: every ``sh`` and ``python`` block of README.md and docs/*.md runs as written
against what ``make demo`` produces (``out/tiny-llama.mlxg``), in a scratch folder, each
in a fresh process, with the slow-BLAS warning (BlasPreloadWarning: mlx imported before
mlxgraph could put the fast BLAS under it) an error: an example must be fast as written.

A block's info string may add one word after the language: ``slow`` (runs under
``make test-slow`` only: exports, which import torch) or ``no-run`` (cannot run here: it
installs system packages, needs a model folder of your own, or would run the test suite
itself, or benchmarks for minutes). The exit code table is checked against the one the CLI defines.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tool_helpers import exported_tiny_llama

from mlxgraph.tools.cli import EXIT_CODES

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)
BIN = Path(sys.executable).parent
SLOW_BLAS = "BlasPreloadWarning"
# Every Python process a block starts (the CLI's too) turns that warning into an error. By
# its text ("mlxgraph: ...", a RuntimeWarning): at startup Python cannot import the class.
WARNINGS = "error:mlxgraph:RuntimeWarning"


def blocks():
    """(id, language, tag, code) of every sh / python block."""
    out = []
    for doc in DOCS:
        for n, m in enumerate(FENCE.finditer(doc.read_text())):
            lang, tag, code = m.group(1), m.group(2).strip(), m.group(3)
            if lang in ("sh", "python"):
                out.append((f"{doc.name}-{n}", lang, tag, code))
    return out


BLOCKS = blocks()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A scratch folder holding what `make demo` writes: out/tiny-llama.mlxg."""
    work = tmp_path_factory.mktemp("docs")
    (work / "out").mkdir()
    graph = exported_tiny_llama(tmp_path_factory, ("float32",))["float32"]
    shutil.copy(graph, work / "out" / "tiny-llama.mlxg")
    return work


def _run(lang, code, cwd):
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": "",
        "PYTHONWARNINGS": WARNINGS,
    }
    argv = (
        ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
    )
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _check(block, demo):
    name, lang, tag, code = block
    proc = _run(lang, code, demo)
    assert proc.returncode == 0, (
        f"{name} ({lang}) failed:\n{code}\n--- stderr:\n{proc.stderr[-2000:]}"
    )
    assert SLOW_BLAS not in proc.stderr, f"{name} ({lang}) runs on the slow BLAS:\n{code}"
    left = _not_ignored(sorted(p.relative_to(demo).as_posix() for p in demo.rglob("*")
                               if p.is_file()))
    assert not left, f"{name} writes {left}, which .gitignore does not cover: run in a checkout, " \
        "they would show as untracked"


def _not_ignored(paths: list) -> list:
    """The paths (relative to the checkout's top) that its .gitignore does not cover."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        return []  # not a checkout: nothing to keep clean
    proc = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"],
                          input="\n".join(paths), capture_output=True, text=True, timeout=60)
    return sorted(set(paths) - set(proc.stdout.splitlines()))


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[2] == ""], ids=lambda b: b[0])
def test_block_runs(block, demo):
    _check(block, demo)


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in BLOCKS if b[2] == "slow"], ids=lambda b: b[0])
def test_slow_block_runs(block, demo):
    _check(block, demo)


def test_a_block_importing_mlx_first_fails(demo):
    """The check above can fail: mlx imported before load() is caught, in Python and in a
    shell block's Python."""
    code = 'import mlx.core\nimport mlxgraph\nmlxgraph.load("out/tiny-llama.mlxg")\n'
    for lang, block in (("python", code), ("sh", f"python -c '{code}'")):
        proc = _run(lang, block, demo)
        assert proc.returncode != 0 and SLOW_BLAS in proc.stderr, (lang, proc.stderr[-2000:])


def test_the_ignore_check_can_fail():
    assert _not_ignored(["out/x.mlxg", "result.json", "notes.md"]) == ["notes.md"]


def test_the_readme_says_first_how_to_get_mlxgraph_on_path():
    """Every block runs with the venv's bin on PATH (above): the README must tell its reader
    to do the same, before its first command."""
    readme = (ROOT / "README.md").read_text()
    first = readme.index("```sh\n")  # the first block that runs
    for step in ("source .venv/bin/activate", 'pip install -e ".[export,serve]"'):
        assert 0 <= readme.find(step) < first, step


@pytest.mark.skipif(not (BIN / "activate").exists(), reason="not run from a virtual environment")
def test_activate_puts_mlxgraph_on_path(tmp_path):
    """The README's way: `source .venv/bin/activate` in a shell that has nothing of it."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(["bash", "-c", f"source '{BIN}/activate' && mlxgraph --version && "
                           "python -m mlxgraph --version"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("mlxgraph 0.") == 2, proc.stdout


def test_blocks_are_tagged_sparingly():
    tags = [b[2] for b in BLOCKS]
    assert set(tags) <= {"", "slow", "no-run"}, tags
    # no-run is for installs, your own model folder and minutes-long benchmarks only.
    assert tags.count("") >= 4 and tags.count("no-run") <= 8


def test_one_exit_code_table_everywhere():
    """README's table is the CLI's EXIT_CODES; the other documents link to it and state no
    code of their own for a failing graph."""
    readme = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(\d+)` \| (.+?) \|$", readme, re.M))
    assert {int(k): v for k, v in rows.items()} == EXIT_CODES
    for doc in DOCS[1:]:
        text = doc.read_text()
        assert not re.search(r"[Ee]xit codes?:? \d", text), (
            f"{doc.name} states exit codes: link README's table"
        )
