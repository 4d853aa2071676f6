"""`verify` makes every check `load` makes: for each place the loader (the interpreter)
raises GraphFormatError of its own, a crafted file that `verify --deep` rejects too.

The raise sites are found by reading the interpreter's source, so a new one without a case
here fails ``test_every_loader_raise_site_has_a_case``: add its crafted file (and the
verifier check), or say why no file can reach it.
"""

import ast
from pathlib import Path

import pytest
from tiny_graph import build_tiny_graph

import mlxgraph
from mlxgraph.interpreter.kernels import get_kernel
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.spec import op_specs
from mlxgraph.schema.verifier import verify_buffer
from mlxgraph.schema.writer import GraphWriter

ROOT = Path(__file__).resolve().parent.parent
LOADER = ROOT / "interpreter"


def _dynamic_input(path):
    """A graph input whose dim is dynamic without a symbol (nothing can bind it)."""
    w = GraphWriter(producer="tests")
    w.add_symbol("T", 1, 8)
    tok = w.add_tensor("tokens", "int32", (1, None))
    w.add_input("tokens", tok)
    out = w.add_tensor("y", "int32", (1, None))
    w.add_node("Neg", x=tok, out=out)
    w.add_output("logits", out)
    w.write(path)


def _no_kernel_reachable(_path):
    """Unreachable from a file: every op of the schema has a kernel (checked here)."""
    missing = [spec.short_name for spec in op_specs().values() if get_kernel(spec.name) is None]
    assert not missing, f"ops without a kernel: {missing}"


# (file under interpreter/, the message's literal text) -> a crafted file's builder, or why
# no file reaches it.
CASES = {
    ("program.py", "layer_id  is used by two UpdateAndAttend nodes"):
        lambda p: build_tiny_graph(p, windows=(0, 0), layer_ids=(0, 0)),
    ("program.py", "layer_id  has no cache geometry in the metadata (metadata.layers)"):
        lambda p: build_tiny_graph(p, record_layers=False),
    ("session/step_inputs.py", "graph input : axis  is dynamic without a symbol"): _dynamic_input,
    ("node_plan.py", "op  has no kernel in this mlxgraph"): _no_kernel_reachable,
    ("pipeline/plan.py", "a pipeline of  stages needs at least  layers (attention or "
                         "recurrent state); the graph has "):
        "load(pipeline=N) only: how a valid file splits into N stages",
    ("pipeline/plan.py", "runtime int $v would cross the pipeline cut before node ; this graph "
                         "cannot be pipelined there"): "load(pipeline=N) only: the split",
    ("pipeline/plan.py", "tensor % () crosses the pipeline cut before node  without a declared "
                         "dtype and shape"): "load(pipeline=N) only: the split",
}


def _literal(node) -> str:
    """The literal text of a message (f-string holes dropped)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_literal(v) for v in node.values)
    if isinstance(node, ast.BinOp):
        return _literal(node.left) + _literal(node.right)
    return ""


def raise_sites() -> set:
    """{(file under the loader, message literal)} of every ``raise GraphFormatError(...)``
    in the loader."""
    sites = set()
    for path in sorted(LOADER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and getattr(node.exc.func, "id", None) == "GraphFormatError"):
                message = _literal(node.exc.args[0]) if node.exc.args else ""
                sites.add((path.relative_to(LOADER).as_posix(), message))
    return sites


def test_every_loader_raise_site_has_a_case():
    found = raise_sites()
    assert found - set(CASES) == set(), "loader checks without a verifier case"
    assert set(CASES) - found == set(), "cases for raise sites that are gone"


@pytest.mark.parametrize("site", sorted(k for k, v in CASES.items() if callable(v)),
                         ids=lambda s: f"{s[0]}:{s[1][:30]}")
def test_verify_rejects_what_load_rejects(site, tmp_path):
    path = tmp_path / "g.mlxg"
    build = CASES[site]
    if build is _no_kernel_reachable:
        build(path)
        return
    build(path)
    data = path.read_bytes()
    with pytest.raises(GraphFormatError) as verified:
        verify_buffer(data, deep=True)
    with pytest.raises(GraphFormatError) as loaded:
        mlxgraph.load(path)
    assert verified.value.reason == loaded.value.reason   # the same check, the same words


def test_layer_ids_must_fit_a_cache_file(tmp_path):
    """Layer ids key a saved cache's tensors (layer.<id>.keys): ints in [0, 2**31 - 1]."""
    path = tmp_path / "g.mlxg"
    build_tiny_graph(path, layer_ids=(-1,))
    with pytest.raises(GraphFormatError, match=r"layer_id -1 is not in \[0, 2147483647\]"):
        verify_buffer(path.read_bytes(), deep=True)
    build_tiny_graph(path, layer_ids=(4096,))
    verify_buffer(path.read_bytes(), deep=True)
    assert list(mlxgraph.load(path).layers) == [4096]


def test_a_reused_attention_layer_gets_a_cache_of_its_own():
    """A model that runs one attention layer twice in a forward (a reused module, or two
    calls of one module) must not write two caches under one layer id (the verifier and the
    loader refuse such a file): the adapter gives the second call the next id after every
    layer_idx of the model, the same in every forward (tests/test_export_breadth.py runs
    diffllama and hrm_text this way against transformers)."""
    import torch

    from mlxgraph.exporter.adapter import DecoderAdapter
    from mlxgraph.exporter.builtins import build_model, make_config

    small = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    model = build_model(make_config("llama", **small))
    model.model.layers[1] = model.model.layers[0]
    adapter = DecoderAdapter(model)
    with torch.no_grad():  # forward after forward: the same ids (1 is no module's now)
        for s in range(2):
            adapter(torch.tensor([[s + 1]], dtype=torch.int32),
                    torch.tensor([s], dtype=torch.int32))
            assert [info.layer_id for info in adapter.layer_infos()] == [0, 1]
