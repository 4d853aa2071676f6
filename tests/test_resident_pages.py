"""exporter/resident_pages.py: the pages of weights read from a clean file mapping are
given back, and nothing else is touched; a quantized export writes the same bytes."""

import sys

import numpy as np
import pytest

from mlxgraph.exporter import export, pipeline
from mlxgraph.exporter.quantize import QuantizeRecipe
from mlxgraph.exporter.resident_pages import ResidentPages, _clean_file_mappings

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")

SMAPS = """\
7f0000000000-7f0000004000 r--p 00000000 fe:00 12 /models/a.safetensors
Rss:                   8 kB
Anonymous:             0 kB
7f0000004000-7f0000008000 rw-p 00000000 fe:00 13 /models/b.safetensors
Anonymous:             4 kB
7f0000008000-7f000000c000 rw-p 00000000 00:00 0
Anonymous:             0 kB
"""


def test_only_file_mappings_without_anonymous_pages_are_clean():
    assert _clean_file_mappings(SMAPS) == [(0x7F0000000000, 0x7F0000004000)]


def _resident_bytes(array) -> int:
    """Resident bytes of the mapping holding ``array`` (its entry in this process's
    smaps)."""
    address = array.ctypes.data
    rss = None
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0]:
                start, end = (int(x, 16) for x in line.split(" ", 1)[0].split("-"))
                inside = start <= address < end
            elif inside and line.startswith("Rss:"):
                rss = int(line.split()[1]) * 1024
    return rss


@linux_only
def test_a_clean_mapping_gives_its_pages_back_and_reads_the_same(tmp_path):
    data = np.arange(1 << 20, dtype=np.float32)
    data.tofile(tmp_path / "w.bin")
    mapped = np.memmap(tmp_path / "w.bin", dtype=np.float32, mode="c")
    assert mapped.sum() == data.sum()  # every page read
    assert _resident_bytes(mapped) >= data.nbytes
    assert ResidentPages().release(mapped)
    assert _resident_bytes(mapped) < 8192  # at most the pages at both ends
    assert np.array_equal(mapped, data)


@linux_only
def test_a_mapping_written_to_is_left_alone(tmp_path):
    np.arange(1 << 20, dtype=np.float32).tofile(tmp_path / "w.bin")
    mapped = np.memmap(tmp_path / "w.bin", dtype=np.float32, mode="c")  # copy-on-write
    mapped[5] = -1.0  # a page of its own: DONTNEED would discard the write
    assert not ResidentPages().release(mapped)
    assert mapped[5] == -1.0 and mapped[6] == 6.0


def test_an_anonymous_array_is_left_alone():
    array = np.arange(1 << 20, dtype=np.float32)
    assert not ResidentPages().release(array)
    assert array[123] == 123.0


@linux_only
def test_a_quantized_export_of_a_folder_gives_pages_back_and_writes_the_same(
        tiny_hf_folder, tmp_path, monkeypatch):
    folder = tiny_hf_folder("llama")
    recipe = QuantizeRecipe("q4", 64, None, None, (), "float16")
    given_back = []

    class Recorded(ResidentPages):
        def release(self, array):
            given_back.append(super().release(array))
            return given_back[-1]

    monkeypatch.setattr(pipeline, "ResidentPages", Recorded)
    export(folder, tmp_path / "released.mlxg", quantize=recipe, max_seq_len=32)
    assert any(given_back)  # (the folder's weights are views of its mapped safetensors)

    class Kept(ResidentPages):
        def release(self, array):
            return False

    monkeypatch.setattr(pipeline, "ResidentPages", Kept)
    export(folder, tmp_path / "kept.mlxg", quantize=recipe, max_seq_len=32)
    assert (tmp_path / "released.mlxg").read_bytes() == (tmp_path / "kept.mlxg").read_bytes()
