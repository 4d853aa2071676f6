"""`mlxgraph generate`'s parts: the samplers and the tokenizers.

Oracles: numpy for the samplers' masks and argmax; the tokenizers library's own decode
for the streamed text.
"""

import mlx.core as mx
import numpy as np
import pytest

from mlxgraph.tools.sampling import Sampler, top_k_mask, top_p_mask
from mlxgraph.tools.tokenizer import ByteTokenizer, HFTokenizer, TokenizerError


# ---------------------------------------------------------------------------- sampling
def _nucleus(logits, p):
    order = np.argsort(-logits)
    probs = np.exp(logits[order] - logits.max())
    probs /= probs.sum()
    before = np.cumsum(probs) - probs
    return set(order[before < p].tolist())


def test_greedy_is_argmax():
    logits = np.random.default_rng(0).standard_normal((4, 1000)).astype(np.float32)
    assert np.array(Sampler()(mx.array(logits))).tolist() == logits.argmax(-1).tolist()


def test_masks_match_numpy():
    logits = np.random.default_rng(1).standard_normal((3, 50)).astype(np.float32)
    kept = np.isfinite(np.array(top_k_mask(mx.array(logits), 7)))
    for row, k in zip(logits, kept, strict=True):
        assert set(np.flatnonzero(k)) == set(np.argsort(-row)[:7])
    kept = np.isfinite(np.array(top_p_mask(mx.array(logits), 0.6)))
    for row, k in zip(logits, kept, strict=True):
        assert set(np.flatnonzero(k)) == _nucleus(row, 0.6)
    # finite logits keep their values
    masked = np.array(top_p_mask(mx.array(logits), 0.6))
    assert np.array_equal(masked[kept], logits[kept])


def test_seeded_sampling_is_reproducible():
    logits = mx.array(np.zeros((1, 64), np.float32))

    def draws(seed):
        s = Sampler(temperature=1.0, seed=seed)
        return [s(logits).item() for _ in range(20)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_top_k_and_top_p_restrict_the_support():
    row = np.random.default_rng(2).standard_normal(40).astype(np.float32) * 2
    batch = mx.array(np.tile(row, (3000, 1)))
    got = set(np.array(Sampler(1.0, top_k=4, seed=0)(batch)).tolist())
    assert got == set(np.argsort(-row)[:4].tolist())
    got = set(np.array(Sampler(1.0, top_p=0.5, seed=0)(batch)).tolist())
    assert got == _nucleus(row, 0.5)


def test_temperature_sampling_follows_softmax():
    row = np.array([1.0, 2.0, 0.5, 3.0, 0.0], np.float32)
    draws = np.array(Sampler(2.0, seed=3)(mx.array(np.tile(row, (20000, 1)))))
    freq = np.bincount(draws, minlength=5) / draws.size
    want = np.exp(row / 2) / np.exp(row / 2).sum()
    assert np.max(np.abs(freq - want)) < 0.015


def test_sampler_rejects_bad_settings():
    for kw in ({"temperature": -1}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            Sampler(**kw)


# ---------------------------------------------------------------------------- tokenizers
def test_byte_tokenizer_streams_whole_characters():
    tok = ByteTokenizer(256, bos=2, specials=(3,))
    text = "héllo ✓ 🙂"
    ids = tok.encode(text)
    assert ids == [2] + list(text.encode())
    dec = tok.stream_decoder()
    pieces = [dec.add(t) for t in ids + [3]] + [dec.flush()]
    assert "".join(pieces) == text
    assert "\ufffd" not in "".join(pieces)
    with pytest.raises(TokenizerError, match="byte 3"):
        tok.encode("a\x03b")


def test_hf_tokenizer_stream_matches_decode(hf_folder):
    tok = HFTokenizer(hf_folder, bos=1)
    ids = tok.encode("once upon a héllo ✓ time")
    assert ids[0] == 1  # add_bos_token honoured
    dec = tok.stream_decoder()
    streamed = "".join(dec.add(t) for t in ids[1:]) + dec.flush()
    assert streamed == tok.decode(ids[1:]) == "once upon a héllo ✓ time"
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        HFTokenizer(hf_folder / "missing")
