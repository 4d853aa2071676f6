"""mlx-community folders (mlx-lm's `convert -q`) export keeping their packed weights bit
for bit, and the graph generates what mlx-lm generates on the folder (issue 32 item 8).

The folders are made here with mlx_lm.convert from the trained built-in tiny-code (a
float16 Llama with a tied embedding): a float16 folder as mlx-community ships them, and a
float32 one.
"""

import json

import mlx.core as mx
import numpy as np
import pytest
from hub_cache import TINY_CODE
from safetensors.numpy import load_file

import mlxgraph
from mlxgraph.exporter import UnsupportedModelError, export
from mlxgraph.schema.reader import open_graph

PROMPT = [int(t) for t in TINY_CODE.joinpath("config.json").read_bytes()[:12]]
STEPS = 24


@pytest.fixture(scope="module", params=[("float16", 4), ("float32", 8)],
                ids=["q4-float16", "q8-float32"])
def folder(request, tmp_path_factory):
    from mlx_lm import convert

    dtype, bits = request.param
    out = tmp_path_factory.mktemp("mlx") / f"tiny-code-q{bits}-{dtype}"
    convert(str(TINY_CODE), str(out), quantize=True, q_bits=bits, q_group_size=64, dtype=dtype)
    return out, dtype, bits


@pytest.fixture(scope="module")
def graph(folder, tmp_path_factory):
    path = tmp_path_factory.mktemp("graph") / "g.mlxg"
    return path, export(str(folder[0]), path)


def test_the_export_keeps_the_folders_dtype_and_packed_weights_bit_for_bit(folder, graph):
    path, stats = graph
    folder, dtype, bits = folder
    assert stats["dtype"] == dtype
    q = stats["quantization"]
    assert q["source"] == "mlx" and q["nodes"] == {"q8": 0, "q4": 0, "float": 0, f"q{bits}": 30}
    weights = load_file(str(folder / "model.safetensors"))
    g = open_graph(path)
    constants = {g.tensors[c.tensor].name: g.constant_array(i)
                 for i, c in enumerate(g.constants)}
    for module in ("model.embed_tokens", "model.layers.2.mlp.down_proj"):
        name = "lm_head.weight" if module == "model.embed_tokens" else f"{module}.weight"
        for part in ("q", "scales", "biases"):
            want = weights[f"{module}.{'weight' if part == 'q' else part}"]
            got = constants[f"{name}.{part}{bits}"]
            assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8),
                                                               want.view(np.uint8)), (module, part)


def _mlx_lm_greedy(folder):
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, _ = load(str(folder))
    out = []
    for token, _ in generate_step(mx.array(PROMPT), model, max_tokens=STEPS):
        out.append(int(token))
    return out


def test_greedy_tokens_equal_mlx_lm_on_the_same_folder(folder, graph):
    program = mlxgraph.load(graph[0])
    ours = mlxgraph.generate(program, PROMPT, max_tokens=STEPS, ignore_eos=True).token_ids
    assert ours == _mlx_lm_greedy(folder[0])


def test_requantizing_or_rounding_the_folder_is_refused_before_tracing(folder, tmp_path):
    from mlxgraph.exporter import ExportError
    from mlxgraph.exporter.quantize import QuantizeRecipe

    with pytest.raises(ExportError, match="already quantized by MLX"):
        export(str(folder[0]), tmp_path / "x.mlxg", quantize=QuantizeRecipe("q8"))
    if folder[1] == "float16":
        with pytest.raises(UnsupportedModelError, match="not bfloat16"):
            export(str(folder[0]), tmp_path / "x.mlxg", dtype="bfloat16")


@pytest.mark.parametrize("block, why", [
    ({"group_size": 32, "bits": 4, "mode": "mxfp4"}, "mode 'mxfp4' is not supported"),
    ({"group_size": 64, "bits": 3}, "3 bits: the graph stores 4 or 8"),
    ({"group_size": 16, "bits": 4}, "group size 16"),
    ({"group_size": 64, "bits": 4, "model.layers.0.mlp.down_proj": {"group_size": 64,
                                                                    "bits": 6}},
     r"6 bits \(model.layers.0.mlp.down_proj\)"),
])
def test_quantizations_the_format_cannot_hold_are_one_line_refusals(tmp_path, block, why):
    config = json.loads(TINY_CODE.joinpath("config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization": block}))
    with pytest.raises(UnsupportedModelError, match=why) as e:
        export(str(tmp_path), tmp_path / "x.mlxg")
    assert "\n" not in str(e.value)
