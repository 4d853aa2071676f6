"""The device plan: a pure function of (graph, device) chosen at load. Forced to "gpu" on
this CPU, a program takes the GPU variants of its kernels (kernels/gpu.py) and its steps
equal the CPU plan's bit for bit over prefill and many decode steps, in float32 and
bfloat16; each variant equals the op's kernel on its own."""

import mlx.core as mx
import numpy as np
import pytest

import mlxgraph
from mlxgraph.exporter import export
from mlxgraph.interpreter import kernels
from mlxgraph.interpreter.kernels import get_kernel, register
from mlxgraph.interpreter.native import activations as native_activations


@pytest.fixture(scope="module")
def llama_graphs(tmp_path_factory, tiny_hf_folder):
    """A tiny Llama exported in float32 and bfloat16."""
    folder = tiny_hf_folder("llama")
    out = {}
    for dtype in ("float32", "bfloat16"):
        out[dtype] = tmp_path_factory.mktemp(dtype) / f"llama-{dtype}.mlxg"
        export(str(folder), out[dtype], dtype=dtype, max_seq_len=64)
    return out


def test_the_plan_follows_the_default_device_unless_forced(llama_graphs):
    path = llama_graphs["float32"]
    assert mlxgraph.load(path).device_plan == ("gpu" if mx.default_device() == mx.gpu else "cpu")
    from mlxgraph.interpreter.program import Program

    gpu = Program.load(path, device_plan="gpu")
    assert gpu.device_plan == "gpu"
    chosen = {n.record.op: n.fn for n in gpu.nodes}
    assert chosen["LinearNode"] is get_kernel("LinearNode", "gpu").fn
    assert chosen["RopeNode"] is get_kernel("RopeNode", "gpu").fn
    assert chosen["AddNode"] is get_kernel("AddNode").fn  # no variant: the op's kernel
    cpu = Program.load(path, device_plan="cpu")
    assert {n.record.op: n.fn for n in cpu.nodes}["LinearNode"] is get_kernel("LinearNode").fn
    with pytest.raises(ValueError, match="device_plan 'tpu'"):
        Program.load(path, device_plan="tpu")


@pytest.fixture
def mlx_ops_on_cpu(monkeypatch):
    """The CPU kernels on MLX's ops, as on a GPU: float32 on the CPU otherwise takes the
    native activations (interpreter/native/activations.py), which no GPU runs. (Not the
    switch variable: the module reads it once per process.)"""
    monkeypatch.setattr(native_activations, "native_module", lambda: None)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_plan_steps_equal_the_cpu_plan_bitwise(llama_graphs, dtype, mlx_ops_on_cpu):
    from mlxgraph.interpreter.program import Program

    path = llama_graphs[dtype]
    sessions = [Program.load(path, device_plan=p).session(capacity=64) for p in ("cpu", "gpu")]
    rng = np.random.default_rng(0)
    prompt = mx.array(rng.integers(4, 256, (1, 9)).astype(np.int32))
    outs = [np.array(s.step(prompt, range(9)).astype(mx.float32)) for s in sessions]
    assert np.array_equal(*outs)
    token = int(outs[0][0, -1].argmax())
    for i in range(24):
        outs = [np.array(s.step(mx.array([[token]]), [9 + i]).astype(mx.float32))
                for s in sessions]
        assert np.array_equal(*outs), f"decode step {i}"
        token = int(outs[0][0, -1].argmax())


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("tokens", [1, 5])
def test_each_variant_equals_the_ops_kernel(dtype, tokens, mlx_ops_on_cpu):
    key = mx.random.key(1)
    x = mx.random.normal((1, 4, tokens, 16), key=key).astype(dtype)
    cos = mx.cos(mx.random.normal((1, 1, tokens, 16), key=mx.random.key(2))).astype(dtype)
    sin = mx.sin(mx.random.normal((1, 1, tokens, 16), key=mx.random.key(3))).astype(dtype)
    w = mx.random.normal((8, 16), key=mx.random.key(4)).astype(dtype)
    b = mx.random.normal((8,), key=mx.random.key(5)).astype(dtype)
    g = mx.random.normal((16,), key=mx.random.key(6)).astype(dtype)
    for op, args in (("RopeNode", (x, cos, sin)), ("SiluNode", (x,)), ("LinearNode", (x, w)),
                     ("LinearNode", (x, w, b)), ("RmsNormNode", (x, g, 1e-5)),
                     ("RmsNormNode", (x, g, 1e-5, 1.0)), ("RmsNormNode", (x, None, 1e-5))):
        want = get_kernel(op).fn(*args)
        got = get_kernel(op, "gpu").fn(*args)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(np.array(got.astype(mx.float32)),
                              np.array(want.astype(mx.float32))), op


def test_a_second_kernel_for_the_same_op_and_device_is_refused():
    with pytest.raises(ValueError, match="already registered for device gpu"):
        register("Rope", device="gpu")(lambda x, cos, sin: x)
    with pytest.raises(ValueError, match="device must be one of"):
        register("Rope", device="npu")
    with pytest.raises(ValueError, match="already registered for variant int8"):
        register("QuantizedLinear", variant="int8")(lambda x: x)
    with pytest.raises(ValueError, match="variant must be one of"):
        register("QuantizedLinear", variant="int4")
    assert get_kernel("RopeNode", "gpu").fn.__module__ == kernels.gpu.__name__
