"""Cache files from strangers and cache files written next to strangers' files.

save: an exclusive temporary beside the target (schema/atomic_write.py), never through a
symlink, never over a folder or device, nothing left behind on failure or interrupt.
Reading: every crafted file (sealed with mlxgraph's own writer: the seal is no secret) is
a CacheFileError before anything the size of its claims is allocated.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlx.core as mx
import pytest
from tiny_graph import build_tiny_graph

import mlxgraph

CORPUS_WORKER = Path(__file__).with_name("cache_corpus_worker.py")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "tiny.mlxg"
    build_tiny_graph(path, windows=(3, 0))
    program = mlxgraph.load(path)
    session = program.session(capacity=32, max_step=4)
    mx.eval(session.step([[1, 2, 3, 4, 5]], range(5)))
    return path, program, session


def test_save_refuses_folders_symlinks_and_devices_and_leaves_nothing(tiny, tmp_path):
    _, _, session = tiny
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    link = tmp_path / "c.safetensors"
    link.symlink_to(victim)
    folder = tmp_path / "folder"
    folder.mkdir()
    for target in (link, folder, "/dev/null"):
        with pytest.raises(FileExistsError, match="refusing to replace it"):
            session.save(target)
    assert victim.read_bytes() == b"precious" and link.is_symlink()
    # The old fixed temporary name planted as a symlink is never written through.
    plain = tmp_path / "d.safetensors"
    os.symlink(victim, f"{plain}.tmp{os.getpid()}")
    session.save(plain)
    assert victim.read_bytes() == b"precious"
    assert mlxgraph.load(tiny[0]).restore(plain).length == session.length
    planted = f"d.safetensors.tmp{os.getpid()}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["victim.txt", "c.safetensors", "folder", "d.safetensors", planted]
    )
    assert sorted(p.name for p in folder.iterdir()) == []


def test_interrupted_saves_leave_nothing_behind(tiny, tmp_path):
    """SIGINT at random moments of a save loop in a child: the target is always whole, and
    no temporary file is ever left, whatever the moment."""
    code = textwrap.dedent(f"""
        import sys, mlx.core as mx, mlxgraph
        session = mlxgraph.load({str(tiny[0])!r}).session(capacity=32, max_step=4)
        mx.eval(session.step([[1, 2, 3, 4, 5]], range(5)))
        session.save(sys.argv[1])
        print("ready", flush=True)
        while True:
            session.save(sys.argv[1])
    """)
    target = tmp_path / "c.safetensors"
    rounds = 12
    for i in range(rounds):
        child = subprocess.Popen([sys.executable, "-c", code, str(target)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        # Spread the interrupts over a save's lifetime (about a millisecond each).
        time.sleep(0.01 + 0.0037 * i)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
        assert child.returncode != 0 and "KeyboardInterrupt" in err, err[-500:]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["c.safetensors"]
    assert mlxgraph.load(tiny[0]).restore(target).length == 5


def test_hostile_cache_corpus_is_refused_by_every_reader(tmp_path):
    """Every mutant of three genuine files (float32 with a wrapped ring, bfloat16, 4-bit)
    through `cache inspect` / `cache diff` (exit 2, one line), the cache view and diff,
    session.restore, program.restore and --prompt-cache: CacheFileError (or the tool's
    one-line error) or a file that really is fine; quickly, and never allocating what the
    sparse files claim (40 GB and 2 GB)."""
    res = subprocess.run([sys.executable, str(CORPUS_WORKER), str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    total = json.loads(res.stdout.strip().splitlines()[-1])
    print(json.dumps(total))
    assert not total["undocumented"], total["undocumented"]
    assert total["cases"] > 500 and total["tally"]["all refused"] > 450
    assert total["slowest"][0] < 10, total["slowest"]
    assert total["max_rss"] < 1 << 30


def test_a_session_trimmed_to_nothing_saves_a_file_it_restores(tiny, tmp_path):
    """A flat store trimmed to 0 keeps its buffer: its snapshot holds no slots and no
    tensors (found by the two-thread race, which saved such a file and could not restore it)."""
    path, program, _ = tiny
    session = program.session(capacity=32, max_step=4)
    mx.eval(session.step([[1, 2]], range(2)))
    session.trim(2)
    session.save(tmp_path / "empty.safetensors")
    again = program.restore(tmp_path / "empty.safetensors")
    assert again.length == 0
    mx.eval(again.step([[3]], [0]))
