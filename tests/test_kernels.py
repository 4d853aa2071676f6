"""The kernel registry (every op has a kernel taking its fields, none forces an evaluation)
and the fused kernels against Hugging Face's own modules.

The other op families are in tests/test_kernels_{elementwise,reduce_matmul,layout}.py;
the calling convention, the torch oracle check and the tolerances in tests/kernel_helpers.py.
"""

import inspect
import re
from pathlib import Path

import mlx.core as mx
import pytest
import torch
from kernel_helpers import (
    BINARY,
    COMPARE,
    F16,
    F32,
    FLOATS,
    TORCH_DTYPE,
    UNARY,
    call,
    check,
    rand,
    seeded,  # noqa: F401 - autouse: per-test seed for rand()
    to_mx,
)

from mlxgraph.interpreter.kernels import get_kernel
from mlxgraph.schema.op_catalogue import Trait, ops_with
from mlxgraph.schema.spec import op_specs

# ---------------------------------------------------------------- the registry


def test_every_op_has_a_kernel_taking_its_fields():
    missing, bad = [], []
    for spec in op_specs().values():
        kernel = get_kernel(spec.name)
        if kernel is None:
            missing.append(spec.name)
            continue
        # Kernels take the op's inputs and attributes, never its output fields.
        fields = {f.name: None for f in spec.inputs + spec.attributes
                  if "deprecated" not in f.attributes}
        if kernel.needs_context:
            fields["ctx"] = None
        try:
            inspect.signature(kernel.fn).bind(**fields)
        except TypeError as e:
            bad.append(f"{spec.name}: {e}")
    assert not missing, f"ops without a kernel: {missing}"
    assert not bad, f"kernels that do not take their op's fields: {bad}"
    # Ops with session state need a store: the recurrent ones' laziness is checked with one in
    # test_state_space.py (UpdateAndAttend has no example, as before).
    stateful = {o.name for o in ops_with(Trait.ATTENTION) + ops_with(Trait.STATE)}
    assert set(EXAMPLES) >= {s.short_name for s in op_specs().values()} - stateful


def test_kernel_sources_never_force_evaluation():
    src = Path(get_kernel("AddNode").fn.__code__.co_filename).parent
    for path in sorted(src.glob("*.py")):
        text = path.read_text()
        for pat in (r"\.item\(", r"\.tolist\(", r"mx\.(async_)?eval\(", r"^\s*(import|from) numpy"):
            assert not re.search(pat, text, re.M), f"{path.name} matches {pat}"


# ---------------------------------------------------------------- fusions


@pytest.fixture(scope="module")
def hf():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb
    return LlamaRMSNorm, Gemma3RMSNorm, apply_rotary_pos_emb


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_rms_norm_matches_hugging_face(hf, dtype):
    llama_cls, gemma_cls, _ = hf
    tx, x = rand((2, 5, 64), dtype, -4, 4)
    tw, w = rand((64,), dtype, -1, 1)
    llama = llama_cls(64, eps=1e-5).to(TORCH_DTYPE[dtype])
    gemma = gemma_cls(64, eps=1e-6).to(TORCH_DTYPE[dtype])
    with torch.no_grad():
        llama.weight.copy_(tw)
        gemma.weight.copy_(tw)
        want_llama, want_gemma = llama(tx), gemma(tx)
    # Both orders are checked to within one rounding of x's dtype (MLX and torch may
    # round the float32 rsqrt differently by an ulp).
    check(call("RmsNorm", x=x, weight=w, eps=1e-5), want_llama, "elementwise", dtype)
    check(
        call("RmsNorm", x=x, weight=w, eps=1e-6, weight_offset=1.0),
        want_gemma,
        "elementwise",
        dtype,
    )
    check(
        call("RmsNorm", x=x, weight=w.astype(F32), eps=1e-5),
        tw.float()
        * (tx.float() * torch.rsqrt(tx.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(tx.dtype),
        "elementwise",
        dtype,
    )
    with torch.no_grad():
        llama.weight.fill_(1.0)
        check(call("RmsNorm", x=x, eps=1e-5), llama(tx), "elementwise", dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_layer_norm_matches_torch(dtype):
    tx, x = rand((2, 5, 64), dtype, -4, 4)
    tw, w = rand((64,), dtype, -1, 1)
    tb, b = rand((64,), dtype, -1, 1)
    F = torch.nn.functional
    check(
        call("LayerNorm", x=x, weight=w, bias=b, eps=1e-5),
        F.layer_norm(tx, (64,), tw, tb, 1e-5),
        "reduce",
        dtype,
    )
    check(
        call("LayerNorm", x=x, weight=w, eps=1e-5),
        F.layer_norm(tx, (64,), tw, None, 1e-5),
        "reduce",
        dtype,
    )
    check(
        call("LayerNorm", x=x, eps=1e-6), F.layer_norm(tx, (64,), None, None, 1e-6), "reduce", dtype
    )


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_rope_matches_hugging_face(hf, dtype):
    _, _, apply_rotary_pos_emb = hf
    tq, q = rand((1, 4, 6, 32), dtype)
    tk, k = rand((1, 2, 6, 32), dtype)
    ang = torch.arange(6)[:, None] * (10000.0 ** (-torch.arange(16) / 16))[None]
    emb = torch.cat([ang, ang], -1)[None]  # [1, T, D] as HF's rotary embedding returns it
    cos, sin = emb.cos().to(TORCH_DTYPE[dtype]), emb.sin().to(TORCH_DTYPE[dtype])
    want_q, want_k = apply_rotary_pos_emb(tq, tk, cos, sin)
    mcos, msin = to_mx(cos)[:, None], to_mx(sin)[:, None]
    check(call("Rope", x=q, cos=mcos, sin=msin), want_q, "elementwise", dtype)
    check(call("Rope", x=k, cos=mcos, sin=msin), want_k, "elementwise", dtype)


# ---------------------------------------------------------------- laziness

_X = mx.ones((2, 3, 4))
_I = mx.array([[0, 2, 1]])
EXAMPLES = {op: dict(x=_X) for op in list(UNARY) + ["LogicalNot", "Gelu", "Clamp"]}
EXAMPLES.update({op: dict(a=_X, b=2.0) for op in list(BINARY) + list(COMPARE) + ["Pow"]})
EXAMPLES.update({op: dict(x=_X, axes=[1]) for op in ("Mean", "Sum", "Max")})
EXAMPLES.update(
    Clamp=dict(x=_X, min=0.0, max=1.0), Where=dict(cond=_X > 0, a=_X, b=0.0),
    Argmax=dict(x=_X, axis=-1), Softmax=dict(x=_X, axis=-1),
    Matmul=dict(a=_X, b=_X.swapaxes(-1, -2)), Addmm=dict(bias=_X[0, :, 0], a=_X[0], b=_X[0].T),
    Linear=dict(x=_X, weight=_X[0], bias=_X[0, :, 0]), Embedding=dict(weight=_X[0], indices=_I),
    Gather=dict(x=_X[0], indices=_I, axis=1), Reshape=dict(x=_X, shape=[6, -1]),
    Permute=dict(x=_X, perm=[2, 0, 1]), Expand=dict(x=_X, shape=[5, -1, -1, -1]),
    Slice=dict(x=_X, axis=-1, start=1, end=2**63 - 1), Select=dict(x=_X, axis=1, index=mx.array(2)),
    Concat=dict(inputs=[_X, _X], axis=0), Squeeze=dict(x=_X[:1]), Unsqueeze=dict(x=_X, axis=0),
    Split=dict(x=_X, axis=2, sizes=[1, 3]), Cast=dict(x=_X, dtype=F16),
    Arange=dict(start=0, end=5, step=1), Full=dict(shape=[2, 2], value=1.0),
    SymSize=dict(x=_X, axis=0), SymArith=dict(op=0, a=1, b=2),
    RmsNorm=dict(x=_X, weight=_X[0, 0], eps=1e-6), Rope=dict(x=_X, cos=_X[0, 0], sin=_X[0, 0]),
    LayerNorm=dict(x=_X, weight=_X[0, 0], bias=_X[0, 0], eps=1e-5),
    TopK=dict(x=_X, k=2, axis=-1),
    QuantizedLinear=dict(x=mx.ones((2, 32)), weight=mx.ones((3, 4), mx.uint32),
                         scales=mx.ones((3, 1)), biases=mx.ones((3, 1)), group_size=32, bits=4),
    QuantizedEmbedding=dict(weight=mx.ones((3, 4), mx.uint32), scales=mx.ones((3, 1)),
                            biases=mx.ones((3, 1)), indices=_I, group_size=32, bits=4),
)


def test_no_kernel_forces_evaluation():
    """Each kernel traced under mx.compile: any evaluation inside would raise."""
    for op, kwargs in EXAMPLES.items():
        arrays = {k: v for k, v in kwargs.items() if isinstance(v, mx.array)}
        rest = {k: v for k, v in kwargs.items() if k not in arrays}
        names = sorted(arrays)

        def run(*vals, op=op, names=names, rest=rest):
            result = call(op, **dict(zip(names, vals, strict=True)), **rest)
            return result if isinstance(result, (mx.array, list)) else mx.array(result)

        mx.eval(mx.compile(run)(*[arrays[n] for n in names]))
