"""`mlxgraph verify`: exit 0 valid, 1 invalid with a one-line reason, 2 unreadable; --deep,
--json."""

import json
import subprocess
import sys
from pathlib import Path

from verifier_helpers import base, const_graph, patched, root

from mlxgraph.schema.format import FORMAT_MAJOR, FORMAT_MINOR

CLI = str(Path(sys.executable).with_name("mlxgraph"))



def _cli(*args):
    return subprocess.run(
        [CLI, "verify", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_cli_valid_invalid_unreadable(tmp_path):
    w, _ = base()
    good = tmp_path / "good.mlxg"
    w.write(good)
    r = _cli(good)
    assert r.returncode == 0 and r.stdout.startswith(
        f"{good}: valid (format {FORMAT_MAJOR}.{FORMAT_MINOR}, 2 nodes, 1 constants, "
    )
    assert r.stdout.rstrip().endswith(" MB)")
    bad = tmp_path / "bad.mlxg"
    bad.write_bytes(good.read_bytes()[:-100])
    for args in ((bad,), (bad, "--deep")):
        r = _cli(*args)
        assert r.returncode == 1 and r.stdout == ""
        lines = r.stderr.splitlines()
        assert (
            len(lines) == 1
            and lines[0].startswith(f"{bad}: invalid: ")
            and "Traceback" not in r.stderr
        )
    r = _cli(tmp_path / "missing.mlxg")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "missing.mlxg" in r.stderr


def test_cli_deep_and_json(tmp_path):
    data = const_graph(tmp_path)
    c1 = root(data).Constants(1)
    path = tmp_path / "flipped.mlxg"
    path.write_bytes(patched(data, c1.Offset(), "B", data[c1.Offset()] ^ 1))
    assert _cli(path).returncode == 0
    r = _cli(path, "--deep", "--json")
    doc = json.loads(r.stdout)
    assert (
        r.returncode == 1
        and doc["valid"] is False
        and doc["format_version"] == f"{FORMAT_MAJOR}.{FORMAT_MINOR}"
    )
    assert doc["error"]["field"] == "constants[1].hash"
    good = tmp_path / "g.mlxg"
    r = _cli(good, "--json")
    doc = json.loads(r.stdout)
    assert (
        r.returncode == 0
        and doc["valid"]
        and doc["nodes"] == 3
        and doc["format_version"] == f"{FORMAT_MAJOR}.{FORMAT_MINOR}"
    )
