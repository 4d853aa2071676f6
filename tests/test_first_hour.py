"""What a new user meets in the first hour: messages that say what to do, prompts from stdin
or a file, Ctrl-C that keeps the output, --version, python -m mlxgraph, raw text in files."""

import json
import os
import pty
import signal
import struct
import subprocess
import sys
import time

import pytest
from synthetic_graphs import llama

from mlxgraph.tools.output import process_seconds

PY = sys.executable
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def _mlxgraph(*args, stdin=None, cwd=None, timeout=120):
    return subprocess.run(
        [PY, "-m", "mlxgraph", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=cwd,
    )


def _graph(path, vocab=256, max_context=256, eos=(255,)):
    spec = llama(
        vocab=vocab, hidden=64, intermediate=128, seed=0, tied=False, max_context=max_context
    )
    spec.metadata.eos_token_ids = tuple(eos)
    spec.metadata.tokenizer = "byte"
    spec.metadata.bos_token_id = 2
    spec.write(path)
    return path


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return _graph(tmp_path_factory.mktemp("first") / "g.mlxg")


def _one_error_line(proc, code=2):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1, proc.stderr
    return lines[0]


def test_version_and_python_m():
    proc = _mlxgraph("--version")
    assert (
        proc.returncode == 0 and proc.stdout.startswith("mlxgraph 0.") and "format" in proc.stdout
    )
    assert "chat" in _mlxgraph("--help").stdout


@pytest.mark.parametrize("command", ["generate", "compare"])
def test_space_separated_ids_are_refused(graph, command):
    args = (
        [graph, "--prompt-ids", "1 2 3"]
        if command == "generate"
        else [graph, graph, "--prompt-ids", "1 2 3"]
    )
    line = _one_error_line(_mlxgraph(command, *args))
    assert "separate token ids with commas" in line and "'1,2,3'" in line


def test_compare_refuses_different_vocabularies(graph, tmp_path):
    other = _graph(tmp_path / "v300.mlxg", vocab=300)
    line = _one_error_line(_mlxgraph("compare", graph, other, "--prompt-ids", "1,2"))
    assert "vocabulary of 256" in line and "300" in line


def test_what_the_path_really_is(tmp_path, graph):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    # generate and the file-reading tools share the check: each case through one of them
    cases = [
        (   # (generate takes a model folder: tests/test_model_graphs.py)
            "inspect",
            folder,
            "a model folder, not a regular file: export it first: mlxgraph export",
        ),
        ("inspect", folder / "model.safetensors", "looks like a safetensors weights file"),
        ("generate", folder / "config.json", "looks like a JSON file"),
        ("verify", tmp_path / "m.gguf", "looks like a GGUF model file"),
    ]
    for command, path, message in cases:
        args = [path, "--prompt-ids", "1"] if command == "generate" else [path]
        code = 1 if command == "verify" else 2  # verify answers "invalid"; the others cannot start
        assert message in _one_error_line(_mlxgraph(command, *args), code), (command, path)


def test_prompt_from_stdin_and_file(graph, tmp_path):
    want = _mlxgraph("generate", graph, "--prompt", "Hi there", "--max-tokens", 3, "--json")
    ids = json.loads(want.stdout)["prompt_ids"]
    got = _mlxgraph(
        "generate", graph, "--prompt", "-", "--max-tokens", 3, "--json", stdin="Hi there"
    )
    assert json.loads(got.stdout)["prompt_ids"] == ids
    (tmp_path / "p.txt").write_text("Hi there")
    got = _mlxgraph(
        "generate", graph, "--prompt-file", tmp_path / "p.txt", "--max-tokens", 3, "--json"
    )
    assert json.loads(got.stdout)["prompt_ids"] == ids
    line = _one_error_line(_mlxgraph("generate", graph, "--prompt-file", tmp_path / "none.txt"))
    assert "--prompt-file" in line and "none.txt" in line


def test_control_characters_raw_in_files_escaped_on_terminals(graph):
    proc = _mlxgraph("generate", graph, "--prompt", "a\x1b[31mb", "--max-tokens", 1)
    assert proc.stdout.startswith("a\x1b[31mb")
    leader, follower = pty.openpty()
    child = subprocess.Popen(
        [
            PY,
            "-m",
            "mlxgraph",
            "generate",
            str(graph),
            "--prompt",
            "a\x1b[31mb",
            "--max-tokens",
            "1",
        ],
        stdout=follower,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    child.wait(timeout=60)
    os.close(leader)
    assert out.startswith(b"a\\x1b[31mb")


def _cpu_seconds(pid) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_until_generating(child, timeout=120.0):
    """Return once the child has mapped MLX's library and then used 1.5 more seconds of CPU
    (it is then generating: loading this tiny graph takes milliseconds). CPU time, not wall
    time, so a busy machine cannot make the child look further along than it is."""
    deadline = time.monotonic() + timeout
    start = None
    while time.monotonic() < deadline:
        try:
            if start is None:
                with open(f"/proc/{child.pid}/maps") as f:
                    if "libmlx" in f.read():
                        start = _cpu_seconds(child.pid)
            elif _cpu_seconds(child.pid) - start >= 1.5:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("the child never loaded mlx" if start is None
                         else "the child did not get 1.5 s of CPU to generate")


@pytest.mark.parametrize("as_json", [True, False])
def test_ctrl_c_keeps_the_tokens_and_the_stats(tmp_path, as_json):
    long = _graph(tmp_path / "long.mlxg", max_context=1 << 16, eos=())
    args = [
        PY,
        "-m",
        "mlxgraph",
        "generate",
        str(long),
        "--prompt-ids",
        "5,6,7",
        "--max-tokens",
        "60000",
    ]
    child = subprocess.Popen(
        args + (["--json"] if as_json else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    _wait_until_generating(child)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    if as_json:
        doc = json.loads(out)
        assert doc["stop_reason"] == "interrupted" and 0 < len(doc["token_ids"]) < 60000
        assert doc["stats"]["generated_tokens"] == len(doc["token_ids"])
    else:
        assert out.endswith("\n") and "stopped: interrupted" in err and "decode" in err


def test_export_without_the_extra_says_how_to_install(tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None; from mlxgraph.tools.cli import main; "
        "sys.exit(main(['export', 'tiny-llama', '-o', 'x.mlxg']))"
    )
    proc = subprocess.run(
        [PY, "-c", code], capture_output=True, text=True, timeout=120, env=ENV, cwd=tmp_path
    )
    line = _one_error_line(proc)
    assert "pip install 'mlxgraph[export]'" in line


def test_process_seconds_counts_from_process_start():
    # This process imported pytest, mlx and more before the test ran.
    assert process_seconds() > 0.2


def test_dir_and_help_list_the_public_names_and_the_package_is_typed():
    import mlxgraph

    assert {"load", "generate", "stream_generate", "ChatSession", "ChatBusyError", "Program",
            "Error", "OptionError", "preload_blas"} <= set(dir(mlxgraph))
    assert set(mlxgraph.__all__) <= set(dir(mlxgraph))
    from pathlib import Path

    assert (Path(mlxgraph.__file__).parent / "py.typed").is_file()  # PEP 561
