"""The custom op mlxgraph::update_and_attend: fake kernel, eager reference cache, adapter.

The eager kernel is checked against a naive attention written independently here (repeat
K/V per group, an explicit boolean mask); the adapted models against HF's own forward.
"""

import math

import pytest
import torch
from conftest import TINY_ARCHS, tiny_hf_model
from torch._subclasses.fake_tensor import FakeTensorMode

from mlxgraph.exporter.adapter import AdapterError, DecoderAdapter
from mlxgraph.exporter.attention_op import ReferenceCache, using_reference_cache

op = torch.ops.mlxgraph.update_and_attend


def _naive(q, ks, vs, qpos, kpos, scale, window):
    """softmax(q k^T * scale + mask) v with K/V repeated per query-head group."""
    group = q.shape[1] // ks.shape[1]
    k = ks.repeat_interleave(group, dim=1)
    v = vs.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    out = torch.empty(q.shape[:-1] + (v.shape[-1],))
    for i, p in enumerate(qpos):
        ok = torch.tensor([s <= p and (window == 0 or p - s < window) for s in kpos])
        w = torch.softmax(scores[:, :, i].masked_fill(~ok, -math.inf), dim=-1)
        out[:, :, i] = (w.unsqueeze(-2) @ v).squeeze(-2)
    return out


@pytest.mark.parametrize("window", [0, 3])
def test_eager_reference_matches_naive_attention_over_chunks(window):
    torch.manual_seed(0)
    reference_cache = ReferenceCache()
    reference_cache.windows[5] = window
    ks, vs, kpos = [], [], []
    for start, end in [(0, 4), (4, 5), (5, 9), (9, 10)]:
        t = end - start
        q, k, v = torch.randn(1, 6, t, 8), torch.randn(1, 2, t, 8), torch.randn(1, 2, t, 4)
        pos = torch.arange(start, end, dtype=torch.int32).reshape(-1, 1)
        before = (q.clone(), k.clone(), v.clone())
        with using_reference_cache(reference_cache):
            out = op(q, k, v, pos, 5, 0.3, None)
        assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v), strict=True))  # functional
        ks.append(k)
        vs.append(v)
        kpos += list(range(start, end))
        want = _naive(
            q, torch.cat(ks, 2), torch.cat(vs, 2), list(range(start, end)), kpos, 0.3, window
        )
        assert out.shape == (1, 6, t, 4)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    assert reference_cache.length(5) == 10


def test_out_dtype_and_fake_kernel_shape():
    reference_cache = ReferenceCache()
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 16)
    pos = torch.arange(3).reshape(-1, 1)
    with using_reference_cache(reference_cache):
        assert op(q, k, v, pos, 0, 0.5, torch.float16).dtype == torch.float16
    with using_reference_cache(reference_cache), FakeTensorMode() as mode:
        fq, fk, fv, fp = (mode.from_tensor(x) for x in (q, k, v, pos))
        out = op(fq, fk, fv, fp, 1, 0.5, None)
        assert out.shape == (1, 4, 3, 16) and out.dtype == torch.float32
    assert reference_cache.length(1) == 0  # tracing touches no cache


def test_gqa_group_mismatch_is_rejected():
    with using_reference_cache(ReferenceCache()), pytest.raises(ValueError, match="multiple"):
        op(torch.randn(1, 3, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8),
           torch.zeros(1, 1, dtype=torch.int32), 0, 1.0, None)


@pytest.mark.parametrize("arch", list(TINY_ARCHS))
def test_adapted_model_matches_hf_with_its_cache(arch):
    """The rewritten torch model is itself an oracle: prefill, a chunk, then decode."""
    from transformers import DynamicCache

    hf, ours = tiny_hf_model(arch), DecoderAdapter(tiny_hf_model(arch))
    tokens = torch.randint(4, 256, (1, 30), generator=torch.Generator().manual_seed(1))
    cache = DynamicCache(config=hf.config)
    with torch.no_grad():
        for start, end in [(0, 11), (11, 16)] + [(i, i + 1) for i in range(16, 30)]:
            want = hf(tokens[:, start:end], cache=cache, use_cache=True,
                      position_ids=torch.arange(start, end)[None]).logits
            got = ours(tokens[:, start:end].int(), torch.arange(start, end, dtype=torch.int32))
            assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_attention_outside_the_adapter_is_an_error():
    model = tiny_hf_model("llama")
    DecoderAdapter(model)  # switches the model to the mlxgraph attention
    with pytest.raises(AdapterError, match="DecoderAdapter"):
        model(torch.zeros(1, 2, dtype=torch.long))


def test_eager_kernel_needs_a_reference_cache():
    """Outside an adapter's forward (or using_reference_cache) there is no history to use."""
    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    with pytest.raises(RuntimeError, match="no reference cache"):
        op(q, k, v, torch.zeros(1, 1, dtype=torch.int32), 0, 1.0, None)


def test_adapters_keep_their_own_history():
    """Two adapters of one model type: each one's eager cache holds only its own steps."""
    a, b = DecoderAdapter(tiny_hf_model("llama")), DecoderAdapter(tiny_hf_model("llama"))
    tokens = torch.randint(4, 256, (1, 6), generator=torch.Generator().manual_seed(2)).int()
    with torch.no_grad():
        first = a(tokens, torch.arange(6, dtype=torch.int32))
        b(tokens[:, :3], torch.arange(3, dtype=torch.int32))
        again = b(tokens[:, 3:], torch.arange(3, 6, dtype=torch.int32))
    torch.testing.assert_close(again, first[:, 3:], rtol=1e-5, atol=1e-5)
    assert a.record.reference_cache.length(0) == 6 and b.record.reference_cache.length(0) == 6
