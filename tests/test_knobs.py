"""The knob table (interpreter/knobs.py): every MLXGRAPH_* variable declared once, one
on/off vocabulary, an invalid value an error naming the variable; docs/knobs.md is the
declaration's table; nothing else in the package reads an MLXGRAPH_* variable."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxgraph.interpreter import knobs
from mlxgraph.interpreter.knobs import KNOBS, KnobError
from tests.test_house_rules import package_sources

ROOT = Path(__file__).resolve().parents[1]
# An invalid value for each knob.
INVALID = {
    "MLXGRAPH_BLAS": None,  # any other value names a library: its errors are test_blas.py's
    "MLXGRAPH_BLAS_ROUTER": "maybe",
    "MLXGRAPH_BLAS_TILE": "fast",
    "MLXGRAPH_BLAS_MATVEC": "gemv",
    "MLXGRAPH_BLAS_THREADS": "two",
    "MLXGRAPH_NATIVE_ACTIVATIONS": "2",
    "MLXGRAPH_QUANTIZED_KERNEL": "fast",
    "MLXGRAPH_QUANTIZED_PREFILL": "tiled",
    "MLXGRAPH_QUANTIZED_THREADS": "0",
    "MLXGRAPH_TOKENIZER_DEADLINE": "-1",
    "MLXGRAPH_GRAPH_CACHE": None,  # any folder name (an unwritable one: the command says so)
}


def test_every_knob_is_declared_once_with_an_invalid_case():
    names = [k.name for k in KNOBS]
    assert len(names) == len(set(names))
    assert set(names) == set(INVALID)
    assert all(name.startswith("MLXGRAPH_") for name in names)


@pytest.mark.parametrize("name", [n for n, v in INVALID.items() if v is not None])
def test_an_invalid_value_names_the_variable_and_its_values(name):
    knob = next(k for k in KNOBS if k.name == name)
    env = {name: INVALID[name]}
    with pytest.raises(KnobError) as caught:
        knob.read(env)
    assert f"{name}={INVALID[name]}: expected {knob.values}" in str(caught.value)
    with pytest.raises(KnobError):
        knobs.check_environment(env)


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_unset_or_empty_is_the_default(knob):
    want = knob.parse(knob.default)
    assert knob.read({}) == want
    assert knob.read({knob.name: "  "}) == want


@pytest.mark.parametrize("knob", [knobs.BLAS_ROUTER, knobs.NATIVE_ACTIVATIONS,
                                  knobs.QUANTIZED_KERNEL, knobs.QUANTIZED_PREFILL],
                         ids=lambda k: k.name)
def test_switches_share_one_vocabulary(knob):
    for word in knobs.ON:
        assert knob.read({knob.name: f" {word.upper()} "}) is True
    for word in knobs.OFF:
        assert knob.read({knob.name: word}) is False


def test_older_spellings_stay_as_aliases():
    assert knobs.QUANTIZED_KERNEL.read({"MLXGRAPH_QUANTIZED_KERNEL": "mlx"}) is False
    assert knobs.QUANTIZED_KERNEL.read({"MLXGRAPH_QUANTIZED_KERNEL": "native"}) is True
    assert knobs.NATIVE_ACTIVATIONS.read({"MLXGRAPH_NATIVE_ACTIVATIONS": "mlx"}) is False
    assert knobs.BLAS_ROUTER.read({"MLXGRAPH_BLAS_ROUTER": "none"}) is False
    tile = {w: knobs.BLAS_TILE.read({"MLXGRAPH_BLAS_TILE": w}) for w in ("auto", "none", "1")}
    assert tile == {"auto": "on", "none": "off", "1": "on"}
    for word in ("none", "bundled", "reference", "0", "off"):
        assert knobs.BLAS.read({"MLXGRAPH_BLAS": word}) == "bundled"
    assert knobs.BLAS.read({"MLXGRAPH_BLAS": " /x/libopenblas.so "}) == "/x/libopenblas.so"


def test_numbers():
    assert knobs.BLAS_THREADS.read({"MLXGRAPH_BLAS_THREADS": "2:4096"}) == (2, 4096)
    assert knobs.BLAS_THREADS.read({"MLXGRAPH_BLAS_THREADS": "3"}) == (3, 0)
    for bad in ("2:0", "0", "2:x", ":5"):
        with pytest.raises(KnobError):
            knobs.BLAS_THREADS.read({"MLXGRAPH_BLAS_THREADS": bad})
    assert knobs.QUANTIZED_THREADS.read({"MLXGRAPH_QUANTIZED_THREADS": "4"}) == 4
    assert knobs.TOKENIZER_DEADLINE.read({"MLXGRAPH_TOKENIZER_DEADLINE": "0.5"}) == 0.5
    for bad in ("0", "nan", "inf", "soon"):
        with pytest.raises(KnobError):
            knobs.TOKENIZER_DEADLINE.read({"MLXGRAPH_TOKENIZER_DEADLINE": bad})


def test_docs_table_is_the_declaration():
    text = (ROOT / "docs" / "knobs.md").read_text()
    table = "\n".join(line for line in text.splitlines() if line.startswith("|"))
    assert table == knobs.markdown_table(), (
        "docs/knobs.md's table differs from interpreter/knobs.py: paste the output of\n"
        "python -c 'from mlxgraph.interpreter.knobs import markdown_table; "
        "print(markdown_table())'")
    assert "docs/knobs.md" in (ROOT / "README.md").read_text()


def test_only_the_knob_table_names_a_variable():
    """A string that is exactly an MLXGRAPH_* name (an os.environ key) appears in no package
    module but knobs.py: every reader asks the knob (docstrings and messages may mention
    names; they are never whole strings)."""
    names = {k.name for k in KNOBS}
    found = []
    for module, path in package_sources().items():
        if module == knobs.__name__:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    node.value in names or node.value.startswith("MLXGRAPH_")
                    and node.value.isupper() and " " not in node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert not found, found


@pytest.mark.parametrize("name, value", [("MLXGRAPH_QUANTIZED_THREADS", "two"),
                                         ("MLXGRAPH_NATIVE_ACTIVATIONS", "maybe")])
def test_a_command_stops_on_a_bad_knob_before_it_runs(tmp_path, name, value):
    env = {**os.environ, name: value}
    graph = tmp_path / "not-read.mlxg"  # the knob fails before the file is opened
    graph.write_bytes(b"x")
    proc = subprocess.run(
        [sys.executable, "-m", "mlxgraph", "generate", str(graph),
         "--prompt-ids", "1"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"mlxgraph: generate: {name}={value}: expected" in proc.stderr
    assert "Traceback" not in proc.stderr
