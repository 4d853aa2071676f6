"""The committed bindings match the schema, and flatc itself reads the files we write.

- generated/mlxgraph_generated.py is exactly what `flatc --python --gen-onefile` makes of
  schema/mlxgraph.fbs (`make generate` rebuilds it).
- `flatc --json` of a written graph file dumps the node stream: the file really is a
  FlatBuffer of the schema, readable by any FlatBuffers tool.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from make_golden import build_sample

from mlxgraph.schema.format import FORMAT_MAJOR

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "schema" / "mlxgraph.fbs"
# flatc is a dev dependency (`make test` installs it): these fail rather than skip without it.
FLATC = shutil.which("flatc", path=str(Path(sys.executable).parent)) or shutil.which("flatc")


@pytest.fixture
def flatc() -> str:
    """The flatc compiler's path."""
    assert FLATC is not None, "flatc (the dev extra's `flatc` package) is not installed"
    return FLATC



def test_generated_bindings_match_schema(tmp_path, flatc):
    subprocess.run([flatc, "--python", "--gen-onefile", "-o", str(tmp_path), str(SCHEMA)],
                   check=True, capture_output=True, timeout=60)
    fresh = (tmp_path / "mlxgraph_generated.py").read_bytes()
    committed = (ROOT / "generated" / "mlxgraph_generated.py").read_bytes()
    assert fresh == committed, "generated/ is stale: run `make generate` and commit the result"


def test_flatc_json_dump_shows_the_node_stream(tmp_path, flatc):
    w = build_sample()
    path = tmp_path / "sample.mlxg"
    w.write(path)
    subprocess.run(
        [
            flatc,
            "--json",
            "--raw-binary",
            "--strict-json",
            "-o",
            str(tmp_path),
            str(SCHEMA),
            "--",
            str(path),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    doc = json.loads((tmp_path / "sample.json").read_text())
    nodes = doc["chains"][0]["nodes"]
    assert [n["op_type"] for n in nodes] == [n.op for n in w.nodes]
    attend = next(n for n in nodes if n["op_type"] == "UpdateAndAttendNode")
    want = next(n for n in w.nodes if n.op == "UpdateAndAttendNode")
    assert {k: attend["op"][k] for k in ("q", "k", "v", "position", "out", "layer_id")} == {
        k: want.fields[k] for k in ("q", "k", "v", "position", "out", "layer_id")}
    assert "out_dtype" not in attend["op"]              # null: q's dtype
    assert attend["provenance"]["module_path"] == want.provenance.module_path
    assert doc["version_major"] == FORMAT_MAJOR and len(doc["tensors"]) == len(w.tensors)
