"""The command line with hostile inputs: non-regular files, bad numbers, names holding
terminal escapes. Every case ends fast with exit 2 and one line, or prints escaped text."""

import os
import subprocess
import sys

import numpy as np
import pytest
from tiny_graph import build_tiny_graph
from tool_helpers import run_cli

from mlxgraph.schema.records import Operand, Provenance
from mlxgraph.schema.writer import GraphWriter

ESC_NAME = "evil\x1b]0;pwned\x07\x1b[2J\u202e"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "tiny.mlxg"
    build_tiny_graph(path)
    return path


def _cli(*argv, timeout=60):
    """`mlxgraph ARGV` in a subprocess (a blocking open would hang this test, not the suite)."""
    res = subprocess.run(
        [sys.executable, "-m", "mlxgraph.tools.cli", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return res.returncode, res.stdout, res.stderr


COMMANDS = (
    ["verify", "X"],
    ["inspect", "X"],
    ["diff", "G", "X"],
    ["compare", "X", "G", "--prompt-ids", "1,2"],
    ["generate", "X", "--prompt-ids", "1"],
)


def test_fifo_exits_2_without_blocking(tmp_path, tiny):
    target = tmp_path / "pipe.mlxg"
    os.mkfifo(target)
    for argv in COMMANDS:  # in a subprocess: a regression would block in open() forever
        code, out, err = _cli(*[target if a == "X" else tiny if a == "G" else a for a in argv])
        assert code == 2, (argv, out, err)
        assert len(err.strip().splitlines()) == 1 and "a FIFO, not a regular file" in err, (
            argv,
            err,
        )


@pytest.mark.parametrize(
    "target, kind", [("folder", "a folder"), ("/dev/zero", "a character device")]
)
def test_folders_and_devices_exit_2(capsys, tmp_path, tiny, target, kind):
    target = tmp_path if target == "folder" else target
    for argv in COMMANDS:
        code, out, err = run_cli(
            capsys, *[target if a == "X" else tiny if a == "G" else a for a in argv]
        )
        assert code == 2, (argv, out, err)
        assert len(err.strip().splitlines()) == 1 and f"{kind}, not a regular file" in err, (
            argv,
            err,
        )


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "G", "--prompt-ids", "1", "--seed", "-1"],
        ["generate", "G", "--prompt-ids", "1", "--seed", str(2**64)],
        ["generate", "G", "--prompt-ids", "1", "--temperature", "nan"],
        ["generate", "G", "--prompt-ids", "1", "--temperature", "inf"],
        ["generate", "G", "--prompt-ids", "1", "--temperature", "-0.5"],
        ["generate", "G", "--prompt-ids", "1", "--top-p", "0"],
        ["generate", "G", "--prompt-ids", "1", "--top-p", "nan"],
        ["generate", "G", "--prompt-ids", "1", "--top-p", "1.5"],
        ["generate", "G", "--prompt-ids", "1", "--top-k", "-3"],
        ["generate", "G", "--prompt-ids", "1", "--max-tokens", "0"],
        ["generate", "G", "--prompt-ids", "1", "--capacity", str(2**31)],
        ["compare", "G", "G", "--prompt-ids", "1", "--rtol", "-1"],
        ["compare", "G", "G", "--prompt-ids", "1", "--rtol", "nan"],
        ["compare", "G", "G", "--prompt-ids", "1", "--rtol", "0"],
        ["compare", "G", "G", "--prompt-ids", "1", "--steps", "-1"],
        ["export", "tiny-llama", "-o", "x.mlxg", "--max-seq-len", "0"],
    ],
)
def test_bad_numbers_are_usage_errors(capsys, tiny, argv):
    argv = [str(tiny) if a == "G" else a for a in argv]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"mlxgraph: {argv[0]}: argument ")
    assert "must be" in err or "is not" in err


def _escape_graph(path):
    w = GraphWriter(producer="tests\x1b[31m")
    t = w.add_symbol("T", 1, 8)
    tok = w.add_tensor("tokens" + ESC_NAME, "int32", (1, "T"))
    w.add_input("tokens", tok)
    emb = w.add_constant("embed" + ESC_NAME, np.ones((4, 2), np.float32))
    x = w.add_tensor("x" + ESC_NAME, "float32", (1, "T", 2))
    w.add_node(
        "Embedding",
        Provenance("src" + ESC_NAME, "mod" + ESC_NAME, "tgt" + ESC_NAME),
        weight=emb,
        indices=tok,
        out=x,
    )
    y = w.add_tensor("y", "float32", (1, "T", 2))
    w.add_node("Mul", a=Operand.tensor(x), b=Operand.value(t), out=y)
    w.add_output("out" + ESC_NAME, y)
    w.metadata.architecture = "arch" + ESC_NAME
    w.metadata.vocab_size = 4
    w.metadata.extra = {"key" + ESC_NAME: "value" + ESC_NAME}
    w.write(path)


def test_stored_names_reach_the_terminal_escaped(tmp_path, capsys):
    a, b = tmp_path / "a.mlxg", tmp_path / "b.mlxg"
    _escape_graph(a)
    _escape_graph(b)
    data = bytearray(b.read_bytes())
    data[data.index(b"evil")] = ord("E")  # one name differs: diff prints it
    b.write_bytes(bytes(data))
    outputs = []
    for argv in (["inspect", a, "--nodes", "--constants"], ["diff", a, b], ["verify", a]):
        code, out, err = run_cli(capsys, *argv)
        outputs.append(out + err)
        assert "\x1b" not in out + err and "\x07" not in out + err and "\u202e" not in out + err, (
            argv
        )
    assert "\\x1b]0;pwned\\x07" in outputs[0] and "\\u202e" in outputs[0]
    assert "\\x1b" in outputs[1]
