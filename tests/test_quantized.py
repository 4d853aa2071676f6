"""Quantized weights (format 1.2): the packed layout is MLX's, the kernels compute what the
dequantized weights compute, and exported q8/q4 graphs decode as a float model holding the
dequantized weights does (torch eager as the oracle, over a prefill and greedy steps)."""

import json

import mlx.core as mx
import numpy as np
import pytest
import torch
from conftest import tiny_hf_model
from parity_helpers import hf_greedy_reference, mlxgraph_parity_errors

from mlxgraph.exporter import export
from mlxgraph.exporter.pipeline import ExportError, QuantizeRecipe
from mlxgraph.exporter.quantize import quantize_weight
from mlxgraph.interpreter.kernels.quantized import quantized_embedding, quantized_linear
from mlxgraph.schema.reader import open_graph


def unpack(packed: np.ndarray, scales, biases, bits: int, group_size: int) -> np.ndarray:
    """The float64 weight a packed triple stands for: this test's own reading of the layout
    (codes of ``bits`` bits, the first in a word's lowest bits; W = scale * code + bias)."""
    words = packed.astype(np.uint64)
    per_word = 32 // bits
    codes = np.stack([(words >> (bits * j)) & (2**bits - 1) for j in range(per_word)], -1)
    codes = codes.reshape(packed.shape[0], -1, group_size).astype(np.float64)
    s = np.asarray(scales, np.float64)[..., None]
    b = np.asarray(biases, np.float64)[..., None]
    return (codes * s + b).reshape(packed.shape[0], -1)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_layout_is_mlx_quantize_layout(bits, group_size):
    w = torch.randn(48, 256, generator=torch.Generator().manual_seed(bits + group_size))
    packed, scales, biases = quantize_weight(w, bits, group_size)
    assert packed.dtype == np.uint32 and packed.shape == (48, 256 * bits // 32)
    assert scales.shape == biases.shape == (48, 256 // group_size)
    ours = unpack(packed, scales.numpy(), biases.numpy(), bits, group_size)
    theirs = mx.dequantize(mx.array(packed), mx.array(scales.numpy()), mx.array(biases.numpy()),
                           group_size=group_size, bits=bits)
    np.testing.assert_allclose(np.array(theirs), ours, rtol=0, atol=1e-6)
    # Round to nearest: no weight is further than half a step from the original.
    step = np.repeat(scales.numpy(), group_size, axis=1)
    assert np.all(np.abs(ours - w.numpy()) <= step / 2 + 1e-6)
    # The reading is MLX's too: mx.quantize's own output unpacks to mx.dequantize's values.
    q, s, b = mx.quantize(mx.array(w.numpy()), group_size=group_size, bits=bits)
    np.testing.assert_allclose(
        unpack(np.array(q), np.array(s), np.array(b), bits, group_size),
        np.array(mx.dequantize(q, s, b, group_size=group_size, bits=bits)), atol=1e-6)


def _whole_tensor_quantize(w, bits, group_size, scales_dtype):
    """The quantization in one pass over the whole weight, as export did before it went by
    row blocks: the bytes the blocks must reproduce."""
    groups = w.to(torch.float32).reshape(w.shape[0], -1, group_size)
    lo, hi = groups.amin(-1), groups.amax(-1)
    scales, biases = ((hi - lo) / (2**bits - 1)).to(scales_dtype), lo.to(scales_dtype)
    s32, b32 = scales.to(torch.float32), biases.to(torch.float32)
    safe = torch.where(s32 == 0, torch.ones_like(s32), s32)
    codes = torch.round((groups - b32[..., None]) / safe[..., None]).clamp_(0, 2**bits - 1)
    codes = codes.to(torch.int64).reshape(w.shape[0], -1, 32 // bits)
    packed = (codes << (torch.arange(32 // bits) * bits)).sum(-1).numpy().astype(np.uint32)
    return packed, scales, biases


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_blocks_give_the_whole_tensor_bytes(monkeypatch, bits, dtype):
    from mlxgraph.exporter import quantize as quantize_module

    # Blocks of 5 rows of 128 (the last one 2 rows): every block boundary is crossed.
    monkeypatch.setattr(quantize_module, "_BLOCK_ELEMENTS", 5 * 128)
    w = torch.randn(37, 128, generator=torch.Generator().manual_seed(bits)).to(dtype)
    w[3, :64] = 0.0  # a constant group (scale 0)
    scales_dtype = torch.float16 if dtype == torch.float32 else dtype
    ours = quantize_weight(w, bits, 64, scales_dtype)
    reference = _whole_tensor_quantize(w, bits, 64, scales_dtype)
    assert ours[0].dtype == np.uint32 and ours[0].tobytes() == reference[0].tobytes()
    for a, b in zip(ours[1:], reference[1:]):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_constant_group_quantizes_exactly():
    w = torch.full((2, 64), 0.375)
    packed, scales, biases = quantize_weight(w, 4, 32)
    assert np.array_equal(unpack(packed, scales, biases, 4, 32), w.numpy())


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("rows", [1, 5])
def test_quantized_linear_is_the_dequantized_product(dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    w, bias = torch.randn(96, 128, generator=gen), torch.randn(96, generator=gen)
    np_dtype = np.float32 if dtype == mx.float32 else np.float16
    packed, scales, biases = quantize_weight(w.to(torch.float16 if rows == 5 else w.dtype), 4, 64)
    s, b = (t.float().numpy().astype(np_dtype) for t in (scales, biases))
    x = np.random.default_rng(rows).standard_normal((1, rows, 128)).astype(np_dtype)
    got = quantized_linear(mx.array(x), mx.array(packed), mx.array(s), mx.array(b),
                           bias=mx.array(bias.numpy().astype(np_dtype)), group_size=64, bits=4)
    want = x.astype(np.float64) @ unpack(packed, s, b, 4, 64).T + bias.numpy().astype(np_dtype)
    assert got.dtype == dtype and got.shape == (1, rows, 96)
    tol = 2e-5 if dtype == mx.float32 else 2e-2
    assert np.abs(np.array(got.astype(mx.float32)) - want).max() <= tol * np.abs(want).max()


def test_quantized_embedding_is_the_dequantized_rows():
    w = torch.randn(40, 64, generator=torch.Generator().manual_seed(3))
    packed, scales, biases = quantize_weight(w, 8, 32)
    idx = np.array([[0, 39, 7], [7, 1, 2]], np.int32)
    got = quantized_embedding(mx.array(packed), mx.array(scales.numpy()),
                              mx.array(biases.numpy()), mx.array(idx), group_size=32, bits=8)
    want = unpack(packed, scales.numpy(), biases.numpy(), 8, 32)[idx]
    assert got.shape == (2, 3, 64)
    np.testing.assert_allclose(np.array(got), want, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- exported graphs
PROMPT, DECODE = 9, 6


def dequantized_model(path, arch: str):
    """The tiny model with every quantized weight of the graph replaced by its dequantized
    value (read from the file by this test's own unpacker): the oracle of the graph."""
    model = tiny_hf_model(arch)
    g = open_graph(path)
    arrays = {c.tensor: g.constant_array(i) for i, c in enumerate(g.constants)}
    for node in g.nodes:
        if not node.op.startswith("Quantized"):
            continue
        f = node.fields
        weight = unpack(arrays[f["weight"]], arrays[f["scales"]], arrays[f["biases"]],
                        f["bits"], f["group_size"])
        module = model.get_submodule(node.provenance.module_path)
        # A new Parameter: tied embedding and head may hold different precisions.
        module.weight = torch.nn.Parameter(torch.tensor(weight, dtype=torch.float32))
    return model


@pytest.fixture(scope="module", params=["q4-embedding-q8", "q8-g128"])
def quantized_case(request, tmp_path_factory):
    """(recipe name, export stats, graph path, float export size) of qwen2 (tied embedding,
    biased q/k/v projections) quantized two ways."""
    recipes = {
        "q4-embedding-q8": QuantizeRecipe("q4", 32, embedding="q8"),
        # hidden 64 is no multiple of 128: every projection reading it stays float.
        "q8-g128": QuantizeRecipe("q8", 128),
    }
    folder = tmp_path_factory.mktemp("quantized")
    path = folder / f"{request.param}.mlxg"
    stats = export(tiny_hf_model("qwen2"), path, max_seq_len=64,
                   quantize=recipes[request.param])
    return request.param, stats, path


def test_quantized_graph_decodes_as_the_dequantized_model(quantized_case):
    name, _, path = quantized_case
    oracle = dequantized_model(path, "qwen2")
    prompt = torch.randint(4, 256, (1, PROMPT), generator=torch.Generator().manual_seed(5))
    reference = hf_greedy_reference(oracle, prompt, DECODE)
    errors = mlxgraph_parity_errors(path, prompt.numpy(), reference, chunk=4)
    assert max(errors["prefill"], errors["decode"], errors["chunked"], errors["batched"]) < 1e-4, \
        errors
    assert errors["tokens"] == reference[2]


def test_quantization_recipe_is_recorded_and_applied(quantized_case):
    name, stats, path = quantized_case
    g = open_graph(path)
    record = json.loads(g.metadata.extra["quantization"])
    assert record == stats["quantization"]
    ops = [n.op for n in g.nodes]
    if name == "q4-embedding-q8":
        # Every Linear (4 per attention, 3 per MLP, 2 layers, the head) and the embedding.
        assert ops.count("QuantizedLinearNode") == 15 and "LinearNode" not in ops
        assert record["nodes"] == {"q4": 15, "q8": 1, "float": 0}
        emb = next(n for n in g.nodes if n.op == "QuantizedEmbeddingNode")
        assert (emb.fields["bits"], emb.fields["group_size"]) == (8, 32)
        assert all(n.fields["bits"] == 4 for n in g.nodes if n.op == "QuantizedLinearNode")
    else:
        assert record["nodes"] == {"q8": 2, "float": 14, "q4": 0}
        # One line per weight: the tied embedding and head are one.
        assert len(record["kept_float"]) == 13
        assert ops.count("QuantizedLinearNode") == 2  # the down projections (in 128)
    # No float copy of a quantized weight is left in the file.
    names = {g.tensors[c.tensor].name for c in g.constants}
    assert "model.layers.0.mlp.down_proj.weight" not in names
    # A float32 graph stores scales and biases as float16 by default.
    scale_dtypes = {g.tensors[n.fields[f]].dtype for n in g.nodes if n.op.startswith("Quantized")
                    for f in ("scales", "biases")}
    assert scale_dtypes == {"float16"} and record["scales"] == "float16"
    assert record["scales_dtypes"]["float32"] == 0


def test_scales_fall_back_to_float32_where_float16_cannot_hold_them():
    from mlxgraph.exporter.quantize import _scales_dtype

    gen = torch.Generator().manual_seed(0)
    normal = torch.randn(8, 64, generator=gen) * 0.05
    tiny = normal * 1e-4    # q8 steps of ~1e-7: float16 subnormals
    huge = normal + 1e5     # biases past float16's range
    recipe = QuantizeRecipe("q8")
    assert _scales_dtype(normal, 8, recipe) == torch.float16
    assert _scales_dtype(tiny, 8, recipe) == torch.float32
    assert _scales_dtype(huge, 8, recipe) == torch.float32
    assert _scales_dtype(normal, 8, QuantizeRecipe("q8", scales="float32")) == torch.float32
    assert _scales_dtype(normal.half(), 8, recipe) == torch.float16  # a float16 graph's own
    # Codes are computed against the rounded float16 scale and bias: still within half a
    # step (of the stored scale) of the original, plus the bias's rounding.
    packed, scales, biases = quantize_weight(normal, 4, 64, torch.float16)
    err = np.abs(unpack(packed, scales.float(), biases.float(), 4, 64) - normal.numpy())
    assert scales.dtype == torch.float16 and err.max() <= scales.float().max() * 0.5 + 1e-4


@pytest.mark.parametrize("recipe, option", [
    (QuantizeRecipe("q3"), "quantize"),
    (QuantizeRecipe("q4", 48), "group_size"),
    (QuantizeRecipe("q4", embedding="q2"), "quantize_embedding"),
    (QuantizeRecipe("q4", scales="bfloat16"), "quantize_scales"),
])
def test_bad_recipes_are_refused_before_loading(tmp_path, recipe, option):
    with pytest.raises(ExportError) as e:
        export("tiny-llama", tmp_path / "x.mlxg", quantize=recipe)
    assert e.value.option == option
    assert not (tmp_path / "x.mlxg").exists()


# ---------------------------------------------------------------- verify
def quantized_graph(bits=4, group_size=32, rows=24, cols=64, x_dim=64, scale_shape=None,
                    scale_dtype="float32", weight_dtype="uint32"):
    """A tokens -> QuantizedEmbedding -> QuantizedLinear graph (GraphWriter), faults as asked."""
    from mlxgraph.schema.writer import GraphWriter

    w = GraphWriter()
    w.add_symbol("T", 1, 16)
    tok = w.add_tensor("tokens", "int32", (1, "T"))
    w.add_input("tokens", tok)
    packed, scales, biases = quantize_weight(torch.randn(rows, cols), 8, 32)
    emb = [w.add_constant("e.q", packed), w.add_constant("e.s", scales.numpy()),
           w.add_constant("e.b", biases.numpy() + 1)]
    x = w.add_tensor("x", "float32", (1, "T", cols))
    w.add_node("QuantizedEmbedding", weight=emb[0], scales=emb[1], biases=emb[2], indices=tok,
               out=x, group_size=32, bits=8)
    words = cols * bits // 32
    groups = scale_shape or (rows, cols // group_size)
    lin = [w.add_constant("l.q", np.arange(rows * words).reshape(rows, words).astype(weight_dtype)),
           w.add_constant("l.s", np.ones(groups, scale_dtype)),
           w.add_constant("l.b", np.zeros(groups, scale_dtype))]
    if x_dim != cols:
        x2 = w.add_tensor("x2", "float32", (1, "T", x_dim))
        w.add_node("Full", shape=[], out=x2, value=0.0, dtype=0)
        x = x2
    y = w.add_tensor("y", "float32", (1, "T", rows))
    w.add_node("QuantizedLinear", x=x, weight=lin[0], scales=lin[1], biases=lin[2], out=y,
               group_size=group_size, bits=bits)
    w.add_output("logits", y)
    w.metadata.vocab_size = rows
    return w


def test_a_valid_quantized_graph_verifies_and_runs(tmp_path):
    import mlxgraph

    quantized_graph().write(tmp_path / "q.mlxg")
    session = mlxgraph.load(tmp_path / "q.mlxg").session(capacity=8)
    assert session.step(np.array([[1, 2, 3]]), range(3)).shape == (1, 3, 24)


@pytest.mark.parametrize("kwargs, field, words", [
    ({"bits": 3}, "QuantizedLinear.bits", "not 4 or 8"),
    ({"group_size": 16}, "QuantizedLinear.group_size", "not one of"),
    ({"scale_shape": (24, 3)}, "QuantizedLinear.scales", "needs [24, 2]"),
    ({"scale_dtype": "int32"}, "QuantizedLinear.scales", "floating dtype"),
    ({"weight_dtype": "int32"}, "QuantizedLinear.weight", "uint32"),
    ({"x_dim": 32}, "QuantizedLinear.x", "rows hold 64 values"),
])
def test_verify_refuses_inconsistent_quantized_nodes(tmp_path, kwargs, field, words):
    from mlxgraph.schema.errors import GraphFormatError
    from mlxgraph.schema.verifier import verify_buffer

    path = tmp_path / "bad.mlxg"
    quantized_graph(**kwargs).write(path)
    with pytest.raises(GraphFormatError) as e:
        verify_buffer(path.read_bytes(), path=path)
    assert e.value.field == field and words in e.value.reason, e.value
    assert e.value.node == 2 - (kwargs.get("x_dim", 64) == 64)


# ---------------------------------------------------------------- command line
@pytest.mark.parametrize("flag", [["--group-size", "64"], ["--quantize-lm-head", "float"],
                                  ["--quantize-exclude", "lm_head"]])
def test_recipe_flags_need_quantize(tmp_path, capsys, flag):
    from tool_helpers import run_cli

    code, _, err = run_cli(capsys, "export", "tiny-llama", "-o", tmp_path / "x.mlxg", *flag)
    assert code == 2 and f"{flag[0]} needs --quantize q8|q4" in err
    assert not (tmp_path / "x.mlxg").exists()


def test_inspect_shows_bits_and_group_sizes(quantized_case, capsys):
    from tool_helpers import run_cli

    name, _, path = quantized_case
    code, out, _ = run_cli(capsys, "inspect", path, "--json")
    groups = json.loads(out)["quantized"]
    if name == "q4-embedding-q8":
        assert groups == [{"op": "QuantizedEmbedding", "bits": 8, "group_size": 32, "nodes": 1},
                          {"op": "QuantizedLinear", "bits": 4, "group_size": 32, "nodes": 15}]
    code, out, _ = run_cli(capsys, "inspect", path)
    assert code == 0 and "quantized   " in out
