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


@pytest.mark.parametrize("case", list(MODELS))
def test_same_graph_as_the_default_table(case, tmp_path, monkeypatch):
    kept = []
    check = decompositions.ops_kept_whole
    monkeypatch.setattr(decompositions, "ops_kept_whole",
                        lambda ep: kept.append(check(ep)) or kept[-1])
    _export(case, tmp_path / "kept.mlxg")
    monkeypatch.setattr(pipeline, "decompose", _default_table)
    _export(case, tmp_path / "default.mlxg")
    kept_bytes, default_bytes = ((tmp_path / f).read_bytes() for f in ("kept.mlxg", "default.mlxg"))
    if kept != [True, True]:
        assert kept_bytes == default_bytes
    else:
        assert _without_names(tmp_path / "kept.mlxg") == _without_names(tmp_path / "default.mlxg")


def test_a_llama_keeps_its_linears(tmp_path, monkeypatch):
    """The case the module is for: tiny-llama's linears and SiLUs all stay whole (the test
    above would pass vacuously if none ever did)."""
    kept = []
    check = decompositions.ops_kept_whole
    monkeypatch.setattr(decompositions, "ops_kept_whole",
                        lambda ep: kept.append(check(ep)) or kept[-1])
    export("tiny-llama", tmp_path / "m.mlxg", max_seq_len=MAX_T)
    assert kept == [True, True]


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
    _export(case, tmp_path / "again.mlxg")
    assert len(calls) == 2 and not check(calls[1])
    monkeypatch.setattr(pipeline, "decompose", _default_table)
    _export(case, tmp_path / "default.mlxg")
    assert (tmp_path / "again.mlxg").read_bytes() == (tmp_path / "default.mlxg").read_bytes()
