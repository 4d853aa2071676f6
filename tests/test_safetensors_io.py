"""The safetensors container on its own: every array shape round-trips, and a file that is
not a regular file, or is damaged, is refused with a message (never a hang or a crash)."""

import os
import threading

import numpy as np
import pytest

from mlxgraph.interpreter.cache.safetensors_io import SafetensorsError, SafetensorsFile, write


@pytest.mark.parametrize("shape", [(0,), (0, 4), (3, 0, 2), (), (2, 3)])
def test_every_shape_round_trips_including_zero_size(tmp_path, shape):
    # A store with no rows yet snapshots to zero-size arrays (this once raised on write).
    rng = np.random.default_rng(0)
    tensors = {
        "f32": rng.standard_normal(shape).astype(np.float32),
        "bits": rng.integers(0, 2**16, shape).astype(np.uint16),
        "after": np.arange(5, dtype=np.int32),
    }
    path = tmp_path / "t.safetensors"
    write(path, tensors, {"k": "v"}, {"bits": "BF16"}, seal="seal")
    back = SafetensorsFile(path)
    assert back.seal_matches("seal")
    assert back.metadata["k"] == "v"
    for name, arr in tensors.items():
        assert back.array(name).shape == arr.shape
        assert np.array_equal(back.array(name), arr)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "cache.safetensors"
    os.mkfifo(fifo)
    result = {}

    def read():
        try:
            SafetensorsFile(fifo)
        except OSError as e:
            result["error"] = str(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "opening a FIFO blocked"
    assert "FIFO" in result["error"]


def test_truncated_file_is_refused(tmp_path):
    path = tmp_path / "t.safetensors"
    write(path, {"a": np.ones((64, 64), np.float32)}, {})
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(SafetensorsError, match="truncated"):
        SafetensorsFile(path)


def test_a_huge_sparse_file_is_refused_from_its_header(tmp_path):
    # The header is checked against the file's size before any data is read: a 64 GiB
    # sparse file costs its header, not 64 GiB of memory (it once raised MemoryError).
    path = tmp_path / "huge.safetensors"
    write(path, {"a": np.ones((4, 4), np.float32)}, {})
    with open(path, "r+b") as f:
        f.truncate(64 << 30)
    with pytest.raises(SafetensorsError, match="trailing bytes"):
        SafetensorsFile(path)


def test_arrays_are_read_only(tmp_path):
    path = tmp_path / "t.safetensors"
    write(path, {"a": np.ones((4, 4), np.float32)}, {})
    with pytest.raises(ValueError):
        SafetensorsFile(path).array("a")[0, 0] = 2.0


def test_a_file_changed_after_its_header_was_read_is_refused(tmp_path):
    path = tmp_path / "a.safetensors"
    write(path, {"a": np.ones((2, 3), np.float32)}, {}, seal="seal")
    back = SafetensorsFile(path)
    write(path, {"a": np.zeros((2, 3), np.float32)}, {}, seal="seal")  # same size, new file
    for read in (lambda: back.array("a"), lambda: back.seal_matches("seal")):
        with pytest.raises(SafetensorsError, match="changed since its header was read"):
            read()
