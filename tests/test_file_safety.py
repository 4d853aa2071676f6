"""Files on disk: writes are atomic and never follow links; a loaded graph never touches its
file again; tools reading constants later notice a changed file."""

import os
import resource
import subprocess
import sys

import numpy as np
import pytest
from tiny_graph import build_tiny_graph

import mlxgraph
from mlxgraph.exporter.finite_weights import nonfinite_weights
from mlxgraph.exporter.pipeline import ExportError, export
from mlxgraph.schema.atomic_write import write_atomically
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.reader import open_graph
from mlxgraph.schema.writer import GraphWriter


def _writer(values=None) -> GraphWriter:
    w = GraphWriter()
    w.add_constant("w", np.arange(6, dtype=np.float32).reshape(2, 3) if values is None else values)
    return w


def test_write_replaces_atomically_and_leaves_nothing(tmp_path):
    target = tmp_path / "g.mlxg"
    target.write_bytes(b"old")
    _writer().write(target)
    assert target.read_bytes()[4:8] == b"MLXG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.mlxg"]


def test_write_never_follows_or_replaces_links_and_devices(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    link = tmp_path / "g.mlxg"
    link.symlink_to(victim)
    for target in (link, tmp_path, "/dev/null"):
        with pytest.raises(FileExistsError, match="refusing to replace it"):
            _writer().write(target)
    assert victim.read_bytes() == b"precious" and link.is_symlink()
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    # An old-style fixed temporary name planted as a symlink is irrelevant: names are random.
    (tmp_path / "h.mlxg.partial").symlink_to(victim)
    _writer().write(tmp_path / "h.mlxg")
    assert victim.read_bytes() == b"precious"


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "g.mlxg"
    target.write_bytes(b"old contents")

    def explode(f):
        f.write(b"x" * 1000)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, explode)
    assert target.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.mlxg"]


def test_file_size_limit_failure_keeps_the_old_file(tmp_path):
    target = tmp_path / "g.mlxg"
    target.write_bytes(b"old contents")
    code = (
        "import resource, sys, numpy as np\n"
        "from mlxgraph.schema.writer import GraphWriter\n"
        "hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))\n"
        "w = GraphWriter(); w.add_constant('w', np.zeros(100000, np.float32))\n"
        "try:\n    w.write(sys.argv[1])\nexcept OSError as e:\n    print('refused', e.errno)\n"
    )
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip("file size limit already below the test's")
    res = subprocess.run(
        [sys.executable, "-c", code, str(target)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0 and "refused" in res.stdout, res.stderr
    assert target.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.mlxg"]


def test_nonfinite_weights_are_refused_unless_allowed(tmp_path):
    for bad in (np.array([1.0, np.nan], np.float32), np.array([np.inf], np.float16)):
        assert "non-finite values" in nonfinite_weights(_writer(bad))
    w = GraphWriter()
    w.add_constant("bf", np.array([0x3F80, 0x7FC0], np.uint16), dtype="bfloat16")  # 1.0, NaN
    assert nonfinite_weights(w).startswith("weight bf has 1 non-finite")
    assert nonfinite_weights(_writer()) is None
    with pytest.raises(ExportError, match="refusing to replace it"):
        export("tiny-llama", "/dev/null")  # refused before the (slow) export starts
    import torch
    from conftest import tiny_hf_model

    model = tiny_hf_model("llama")
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    with pytest.raises(ExportError, match="model.norm.weight has 1 non-finite .*--allow-nonfinite"):
        export(model, tmp_path / "nan.mlxg")
    assert list(tmp_path.iterdir()) == []


def test_loaded_program_survives_its_file_changing(tmp_path):
    path = tmp_path / "tiny.mlxg"
    build_tiny_graph(path)
    program = mlxgraph.load(path)
    session = program.session(capacity=8)
    want = np.array(session.step([[1, 2]], [0, 1]))
    with open(path, "r+b") as f:
        f.truncate(100)
    again = np.array(program.session(capacity=8).step([[1, 2]], [0, 1]))
    assert np.array_equal(want, again)


def test_tools_notice_a_changed_file(tmp_path):
    path = tmp_path / "tiny.mlxg"
    build_tiny_graph(path)
    graph = open_graph(path)
    first = graph.constant_array(0).copy()
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data))  # same bytes, new modification time
    os.utime(path, ns=(1, 1))
    with pytest.raises(GraphFormatError, match="changed since it was opened"):
        graph.constant_array(0)
    with open(path, "r+b") as f:
        f.truncate(len(data) // 2)
    with pytest.raises(GraphFormatError):
        graph.constant_bytes(0)
    assert np.array_equal(open_graph(bytes(data)).constant_array(0), first)


RACE = r"""
import os, sys, threading, time
import mlxgraph
from mlxgraph.schema.errors import GraphFormatError
src, path = sys.argv[1], sys.argv[2]
data = open(src, 'rb').read()
stop = time.monotonic() + float(sys.argv[3])
def churn():
    i = 0
    while time.monotonic() < stop:
        with open(path, 'r+b') as f:
            f.truncate((i * 7919) % len(data))
            f.seek(0); f.write(data)
        i += 1
threading.Thread(target=churn, daemon=True).start()
loads = refused = 0
while time.monotonic() < stop:
    try:
        p = mlxgraph.load(path); s = p.session(capacity=8); import mlx.core as mx
        mx.eval(s.step([[1]], [0])); loads += 1
    except GraphFormatError:
        refused += 1
print(loads, refused)
"""


def test_truncation_race_never_crashes_a_reader(tmp_path):
    src = tmp_path / "src.mlxg"
    build_tiny_graph(src)
    path = tmp_path / "g.mlxg"
    path.write_bytes(src.read_bytes())
    res = subprocess.run(
        [sys.executable, "-c", RACE, str(src), str(path), "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]  # a SIGBUS would be -7
    loads, refused = map(int, res.stdout.split())
    assert loads + refused > 10
