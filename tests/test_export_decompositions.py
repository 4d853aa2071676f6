"""exporter/decompositions.py writes the graph run_decompositions' default table writes.

Every tiny model the export tests build (built-ins, the random configs, issue 31's
architectures, mixture-of-experts, latent attention, ALiBi, state-space families) is
exported twice: as the exporter does, and with the plain ``ep.run_decompositions()`` it
replaced. Where every linear and SiLU was kept whole the files must agree in everything
but fx's node names (nodes, their fields and wiring, provenance's module paths and
targets, tensor dtypes and shapes, constants' names and bytes, metadata); where any was
not, byte for byte.
"""

import warnings

import pytest
from test_alibi import FAMILIES as ALIBI
from test_export_breadth import CONFIGS as BREADTH
from test_export_loads import RANDOM_CONFIGS
from test_exporter_moe import _SMALL as MOE_BASE
from test_exporter_moe import MOE_ARCHS
from test_latent_attention import FAMILIES as LATENT
from test_state_space import FAMILIES as STATE_SPACE

from mlxgraph.exporter import decompositions, export, pipeline
from mlxgraph.exporter.builtin_names import BUILTINS, TRAINED_BUILTINS
from mlxgraph.exporter.builtins import build_model, make_config
from mlxgraph.schema.reader import open_graph

MAX_T = 32
# case id -> (model type, config overrides), or a built-in's name -> None
MODELS = {
    **dict.fromkeys([*TRAINED_BUILTINS, *BUILTINS]),
    **{t: (t, c) for t, c in RANDOM_CONFIGS.items()},
    **{t: (t, c) for t, c in BREADTH.items()},
    **{f"moe-{a}": (t, {**MOE_BASE, **c}) for a, (t, c) in MOE_ARCHS.items()},
    **{t: (t, c) for t, c in LATENT.items()},
    **{t: (t, c) for t, c in ALIBI.items()},
    **{t: (t, c) for t, (c, _) in STATE_SPACE.items()},
}


def _default_table(ep):
    """The decomposition this module checks against: the whole default table, as before."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        return ep.run_decompositions()


def _export(case, path):
    spec = MODELS[case]
    model = case if spec is None else build_model(make_config(spec[0], **spec[1]), seed=0)
    export(model, path, max_seq_len=MAX_T)


def _without_names(path) -> dict:
    """Everything a graph file holds but fx's node names (tensor names and provenance's
    source); constants keep their names (parameter paths) and compare by content."""
    g = open_graph(path)
    names = [t.name for t in g.tensors]
    return {
        "metadata": g.metadata,
        "symbols": g.symbols,
        "values": g.values,
        "inputs": g.inputs,
        "outputs": g.outputs,
        "tensors": [(t.dtype, t.shape) for t in g.tensors],
        "constants": [(c.tensor, names[c.tensor], c.hash, bytes(g.constant_bytes(i)))
                      for i, c in enumerate(g.constants)],
        "nodes": [(n.op, n.fields, n.provenance.module_path, n.provenance.target)
                  for n in g.nodes],
    }


def _record(monkeypatch) -> dict:
    """Which paths decompose_to_core_aten takes: each ops_kept_whole and
    decompose_directly result, in call order."""
    calls = {"kept": [], "direct": []}
    check, direct = decompositions.ops_kept_whole, decompositions.decompose_directly
    monkeypatch.setattr(decompositions, "ops_kept_whole",
                        lambda ep: calls["kept"].append(check(ep)) or calls["kept"][-1])
    monkeypatch.setattr(decompositions, "decompose_directly",
                        lambda ep: calls["direct"].append(direct(ep)) or calls["direct"][-1])
    return calls


@pytest.mark.parametrize("case", list(MODELS))
def test_same_graph_as_the_default_table(case, tmp_path, monkeypatch):
    calls = _record(monkeypatch)
    _export(case, tmp_path / "kept.mlxg")
    monkeypatch.setattr(pipeline, "decompose", _default_table)
    _export(case, tmp_path / "default.mlxg")
    kept_bytes, default_bytes = ((tmp_path / f).read_bytes() for f in ("kept.mlxg", "default.mlxg"))
    # [True]: rewritten directly; [True, True]: re-traced with linears and SiLUs kept
    if calls["kept"] not in ([True], [True, True]):
        assert kept_bytes == default_bytes
    else:
        assert _without_names(tmp_path / "kept.mlxg") == _without_names(tmp_path / "default.mlxg")


def test_a_llama_is_decomposed_directly(tmp_path, monkeypatch):
    """The case exporter/direct_decompositions.py is for: tiny-llama's program needs no
    re-trace (the test above would pass vacuously if none ever took that path)."""
    calls = _record(monkeypatch)
    export("tiny-llama", tmp_path / "m.mlxg", max_seq_len=MAX_T)
    assert calls == {"kept": [True], "direct": [True]}


def test_a_llama_keeps_its_linears(tmp_path, monkeypatch):
    """Without the direct rewrite, tiny-llama's linears and SiLUs all stay whole through
    the re-trace, and the graph is the default table's."""
    calls = _record(monkeypatch)
    monkeypatch.setattr(decompositions, "decompose_directly", lambda ep: False)
    export("tiny-llama", tmp_path / "kept.mlxg", max_seq_len=MAX_T)
    assert calls["kept"] == [True, True]
    monkeypatch.setattr(pipeline, "decompose", _default_table)
    export("tiny-llama", tmp_path / "default.mlxg", max_seq_len=MAX_T)
    assert _without_names(tmp_path / "kept.mlxg") == _without_names(tmp_path / "default.mlxg")


def test_a_linear_that_fails_after_decomposing_goes_back_to_the_default_table(tmp_path,
                                                                           monkeypatch):
    """A program let through the first check (here: forced) whose decomposed linears fail
    the second is decomposed again with the default table, from the untouched program."""
    case = "moe-qwen3_moe"  # its router is a linear of a 2-D input: never kept
    check = decompositions.ops_kept_whole
    calls = []

    def first_passes(ep):
        calls.append(ep)
        return len(calls) == 1 or check(ep)

    monkeypatch.setattr(decompositions, "ops_kept_whole", first_passes)
    monkeypatch.setattr(decompositions, "decompose_directly", lambda ep: False)  # re-traced
    _export(case, tmp_path / "again.mlxg")
    assert len(calls) == 2 and not check(calls[1])
    monkeypatch.setattr(pipeline, "decompose", _default_table)
    _export(case, tmp_path / "default.mlxg")
    assert (tmp_path / "again.mlxg").read_bytes() == (tmp_path / "default.mlxg").read_bytes()
