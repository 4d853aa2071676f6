"""The schema evolution gate: the schema stays compatible with every released one, and the
golden files written by each released version still open, verify and decode as recorded.

`flatc --conform` checks table layouts (removed, moved or retyped fields); it does not
notice a removed enum value or union member, so the schema model (schema/spec.py) checks
those, and each field's slot role, too.
"""

import dataclasses
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from make_golden import golden_steps

from mlxgraph.schema import spec
from mlxgraph.schema.format import format_version
from mlxgraph.schema.reader import open_graph
from mlxgraph.schema.records import Operand

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "schema" / "mlxgraph.fbs"
HISTORY = sorted((ROOT / "schema" / "history").glob("*.fbs"))
GOLDEN = sorted((ROOT / "tests" / "golden").glob("format-*.mlxg"))
# flatc is a dev dependency (`make test` installs it): the gate fails rather than skip without it.
FLATC = shutil.which("flatc", path=str(Path(sys.executable).parent)) or shutil.which("flatc")


def conform(base: Path, new: Path) -> subprocess.CompletedProcess:
    """``flatc --conform base new``: does schema ``new`` keep ``base``'s table layouts?"""
    assert FLATC is not None, "flatc (the dev extra's `flatc` package) is not installed"
    return subprocess.run(
        [FLATC, "--conform", str(base), str(new)], capture_output=True, text=True, timeout=60
    )


def parse(path: Path):
    return spec.parse_schema(path.read_text())


def incompatibilities(old, new) -> list:
    """What ``new`` breaks of ``old`` beyond flatc's view: enum values, union members, roles."""
    problems = []
    for name, t in old.types.items():
        cur = new.types.get(name)
        if cur is None or cur.kind != t.kind:
            problems.append(f"{t.kind} {name} removed or changed kind")
            continue
        for member, code in t.values.items():
            if cur.values.get(member) != code:
                problems.append(f"{name}.{member} (= {code}) removed or renumbered")
        current_fields = {f.name: f for f in cur.fields}
        for f in t.fields:
            g = current_fields.get(f.name)
            if g is None:
                problems.append(f"{name}.{f.name} removed")
            elif (f.kind, f.type, f.is_vector, f.default) != (g.kind, g.type, g.is_vector,
                                                              g.default):
                problems.append(f"{name}.{f.name} changed kind, type or default")
            elif "required" in g.attributes and "required" not in f.attributes:
                problems.append(f"{name}.{f.name} became required")
    return problems


# sha256 of every released schema. A history file never changes once its version is
# released: a new field goes into the next version's file. (The one exception is a
# version being made, see BEING_MADE, whose pin moves with it until it ships.)
HISTORY_SHA256 = {
    "1.0.fbs": "bd0fe713d688b8df84af7ac9e78ee3aa2d215c08d4557a824b12923dbcab7de0",
    "1.1.fbs": "fdf05de66de3a693d3f93b5db13b34543cefb56a531a6c6320518e8ee8bbc636",
    "1.2.fbs": "b546c8e5ebd30349f8a8fe304ee840b791c20b221d9111fbc700f39db010e503",
    "1.3.fbs": "26a997c13d1d00a76b7f606ee51531137582517c625042908430b851de7b767c",
}


def test_history_holds_the_current_format_version():
    names = [p.stem for p in HISTORY]
    assert "1.0" in names and format_version() in names, names


def test_history_files_are_pinned_and_unchanged():
    got = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in HISTORY}
    assert got == HISTORY_SHA256, "a released schema/history file changed, or one is not pinned"


def test_newest_history_file_is_the_schema():
    newest = max(HISTORY, key=lambda p: tuple(int(x) for x in p.stem.split(".")))
    assert newest.stem == format_version()
    assert newest.read_text() == SCHEMA.read_text(), (
        f"schema/mlxgraph.fbs differs from {newest.name}: copy it there (a change in the version "
        "being made) or start the next version")


@pytest.mark.parametrize("released", HISTORY, ids=[p.name for p in HISTORY])
def test_schema_conforms_to_released(released):
    r = conform(released, SCHEMA)
    assert r.returncode == 0, r.stderr or r.stdout
    assert incompatibilities(parse(released), parse(SCHEMA)) == []


@pytest.mark.parametrize("edit", ["remove_field", "retype_field", "reorder_union"])
def test_gate_fails_on_incompatible_edit(tmp_path, edit):
    text = SCHEMA.read_text()
    edits = {
        "remove_field": (r"\n\s*scale: float = null;", ""),
        "retype_field": (r"scale: float = null;", "scale: int = null;"),
        "reorder_union": (r"NegNode, ExpNode,", "ExpNode, NegNode,"),
    }
    pattern, repl = edits[edit]
    broken, n = re.subn(pattern, repl, text, count=1)
    assert n == 1, f"the schema no longer has what the {edit} edit changes"
    path = tmp_path / "mlxgraph.fbs"
    path.write_text(broken)
    assert conform(HISTORY[-1], path).returncode != 0


def test_model_check_catches_what_flatc_misses(tmp_path):
    """Dropping the last union member or enum value passes flatc --conform; not this gate."""
    text = SCHEMA.read_text()
    last = list(parse(SCHEMA).types["OpNode"].values)[-1]
    dropped, n = re.subn(rf"(union OpNode \{{[^}}]*?),?\s*{last},?\s*\}}", r"\1 }", text)
    assert n == 1
    path = tmp_path / "mlxgraph.fbs"
    path.write_text(dropped)
    assert any(last in p for p in incompatibilities(parse(SCHEMA), parse(path)))
    assert conform(SCHEMA, path).returncode == 0    # flatc alone would let it through
    roles = tmp_path / "roles.fbs"
    roles.write_text(text.replace("q: int = null (in);", "q: int = null (out);", 1))
    assert incompatibilities(parse(SCHEMA), parse(roles)) == [
        "UpdateAndAttendNode.q changed kind, type or default"
    ]


# ---------------------------------------------------------------- golden files
def _same(expected, got) -> bool:
    if isinstance(expected, dict):        # an Operand
        return isinstance(got, Operand) and (got.kind, got.index, got.number) == (
            expected["kind"], expected["index"], expected["number"])
    if isinstance(expected, list):
        return len(expected) == len(got) and all(
            _same(e, g) for e, g in zip(expected, got, strict=True)
        )
    if isinstance(expected, float):       # float attributes may be stored as float32
        return math.isclose(expected, got, rel_tol=1e-6)
    return expected == got


def _record(golden: Path) -> dict:
    """The golden's JSON record (format-X.Y.json next to format-X.Y.mlxg)."""
    return json.loads(golden.with_name(golden.name[:-len(".mlxg")] + ".json").read_text())


# The version being made, if any ("X.Y", or None): it has no golden yet. The coordinator
# writes its golden when it ships (tests/make_golden.py), and then empties this.
BEING_MADE = None


def test_golden_files_exist():
    """Every released version, the one this mlxgraph writes included, has its golden."""
    names = [p.name for p in GOLDEN]
    for version in [p.stem for p in HISTORY if p.stem != BEING_MADE]:
        assert f"format-{version}.mlxg" in names
    assert format_version() == BEING_MADE or f"format-{format_version()}.mlxg" in names


# sha256 of every golden file: a released golden never changes (tests/make_golden.py refuses
# to overwrite one); a new version's golden is pinned when it ships.
GOLDEN_SHA256 = {
    "format-1.0.json": "215b4ebce2a1e38b34c55abe0a1299cfa669ea740f6993097f4a400caa67c6f6",
    "format-1.0.mlxg": "c8f7c198d6b8ea658980730f06ac03b6249644a33681a95e933de9846abfbc31",
    "format-1.0.outputs.json": "1d53c4af4b4d4f1a8758176489943dbce02b4e5b56008b65513e01eae22cc659",
    "format-1.1.json": "3115ef8bf7e888ab504399ad2164a34940001df950308d1e81614c410bc205e5",
    "format-1.1.mlxg": "df2379bc2d0cecac7652e64ee3e0d0cc03f0012de49ea31c0276ba5b609ce32b",
    "format-1.1.outputs.json": "015bdc5d2639c4f41c00cdaf7553105ff364d5c5b474ebf4ce1755844c24b4b0",
    "format-1.2.json": "45c9c2ae02049c89a4e6a381bfc0b32dd85f0fd0ab17a936c0eed679f6542509",
    "format-1.2.mlxg": "e5e9739d699e662135edc4a04688565a681ef54dfe450f488810f8d8d64fb6bc",
    "format-1.2.outputs.json": "8a8e3bff06579bcbbd98ca920ed475acda56b8e2983e7ebd622b6cd88a66574d",
    "format-1.3.json": "492cc83b916774ce2d3a6f9916bcabae116f88a950f0b830c7e053ea771b2dba",
    "format-1.3.mlxg": "1858e3d839a4418b0332fca14ea160155066e9b89f1f874d4089255b110295d0",
    "format-1.3.outputs.json": "bf01c32d2fd7c56571c28ef64920a4b0fc902645355b912742f1537507f94730",
}


def test_golden_files_are_pinned_and_unchanged():
    folder = ROOT / "tests" / "golden"
    got = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    assert got == GOLDEN_SHA256, "a released golden file changed, or one is not pinned"


@pytest.mark.parametrize("golden", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_file_opens_verifies_and_decodes(golden):
    want = _record(golden)
    g = open_graph(golden, deep=True)
    assert "{}.{}".format(*g.version) == want["format_version"] == golden.stem[len("format-"):]
    assert g.producer == want["producer"]
    assert [[s.name, s.min, s.max, s.value] for s in g.symbols] == want["symbols"]
    assert g.values == want["values"]
    assert [[t.name, t.dtype, list(t.shape)] for t in g.tensors] == want["tensors"]
    assert (g.inputs, g.outputs) == (want["inputs"], want["outputs"])
    assert len(g.constants) == len(want["constants"])
    for i, (c, w) in enumerate(zip(g.constants, want["constants"], strict=True)):
        assert (c.tensor, c.hash) == (w["tensor"], w["hash"])
        assert np.array_equal(g.constant_array(i).astype(np.float64).ravel(), w["values"])
    assert len(g.nodes) == len(want["nodes"])
    for i, (n, w) in enumerate(zip(g.nodes, want["nodes"], strict=True)):
        assert n.op == w["op"], i
        for name, value in w["fields"].items():
            assert _same(value, n.fields[name]), (i, name, value, n.fields[name])
        if n.op == "UpdateAndAttendNode":
            # Absent: q's dtype, no sinks (1.1), no softcapping (1.1), no ALiBi (1.3).
            for name, default in (("out_dtype", None), ("sinks", None), ("softcap", None),
                                  ("alibi_slopes", None)):
                if name not in w["fields"]:
                    assert n.fields[name] == default, (i, name)
        assert [n.provenance.source, n.provenance.module_path, n.provenance.target] == w[
            "provenance"
        ]
    m, wm = g.metadata, want["metadata"]
    assert len(m.layers) == len(wm["layers"])
    for lc, recorded in zip(m.layers, wm["layers"], strict=True):
        # Fields appended after the golden's version read as their defaults.
        defaults = [f.default for f in dataclasses.fields(lc)][len(recorded) :]
        assert list(dataclasses.astuple(lc)) == recorded + defaults
    # Recurrent states (1.3): a golden of an older version records none.
    assert [[st.layer_id, list(st.shape), st.dtype] for st in m.states] == wm.get("states", [])
    assert (
        m.architecture,
        m.num_layers,
        m.vocab_size,
        m.hidden_size,
        m.max_context,
        list(m.eos_token_ids),
        m.bos_token_id,
        m.tokenizer,
        m.extra,
    ) == (
        wm["architecture"],
        wm["num_layers"],
        wm["vocab_size"],
        wm["hidden_size"],
        wm["max_context"],
        wm["eos_token_ids"],
        wm["bos_token_id"],
        wm["tokenizer"],
        wm["extra"],
    )


@pytest.mark.parametrize("golden", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_file_loads_and_runs(golden):
    import mlxgraph

    program = mlxgraph.load(golden)
    want = json.loads(golden.with_name(golden.name[:-len(".mlxg")] + ".outputs.json").read_text())
    vocab = _record(golden)["metadata"]["vocab_size"]
    recorded = [want] + ([want["next"]] if "next" in want else [])  # "next": from 1.3 on
    steps = golden_steps(program.session(capacity=16), want)
    for (tokens, outs), expected_step in zip(steps, recorded, strict=True):
        assert set(outs) == set(expected_step["outputs"])
        assert outs["logits"].shape == (1, len(tokens), vocab)
        for name, expected in expected_step["outputs"].items():
            # The same numbers the file gave when its version was released; a second step
            # reads what the first left in the KV caches and recurrent states.
            got = outs[name]
            # float16 outputs agree to their own rounding: the BLAS under MLX (preloaded or
            # MLX's bundled one) may sum in another order, one float16 ulp apart.
            tol = 1e-3 if got.dtype == np.float16 else 1e-5
            np.testing.assert_allclose(got, expected, rtol=tol, atol=tol,
                                       err_msg=f"{name}, step of {tokens}")


_OLD_READER = """
import sys
from pathlib import Path

import mlxgraph.schema.format as fmt
import mlxgraph.schema.spec as spec

history, golden = Path(sys.argv[1]), Path(sys.argv[2])
# This reader as the previous release was: its schema model and its format version.
fmt.FORMAT_MAJOR, fmt.FORMAT_MINOR = (int(x) for x in history.stem.split("."))
spec.SCHEMA_PATH = history
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.verifier import verify_buffer

try:
    verify_buffer(golden.read_bytes(), path=golden)
except GraphFormatError as e:
    print(e)
else:
    print("ACCEPTED")
"""


def test_a_reader_of_the_previous_format_refuses_a_newer_file_by_name(tmp_path):
    """The reader, given the previous release's schema, meets a file of the current format
    (its golden, or, for a version being made, the golden's graph written now): it must
    say the file comes from a newer mlxgraph, not skip fields it cannot honour."""
    previous = sorted(HISTORY, key=lambda p: tuple(int(x) for x in p.stem.split(".")))[-2]
    golden = ROOT / "tests" / "golden" / f"format-{format_version()}.mlxg"
    if format_version() == BEING_MADE:
        from make_golden import build_sample

        golden, w = tmp_path / "current.mlxg", build_sample()
        total = w.add_tensor("total_expm1", "float32", (1, "T"))
        w.add_node("Expm1", x=w.outputs[1][1], out=total)  # an op of the version being made
        w.add_output("total_expm1", total)
        w.write(golden)
    r = subprocess.run([sys.executable, "-c", _OLD_READER, str(previous), str(golden)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"written by a newer mlxgraph (format {format_version()})" in r.stdout, r.stdout
    assert f"this mlxgraph (format {previous.stem})" in r.stdout, r.stdout
