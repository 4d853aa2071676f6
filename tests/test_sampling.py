"""`mlxgraph generate`'s parts: the samplers and the tokenizers.

Oracles: numpy for the samplers' masks and argmax; the tokenizers library's own decode
for the streamed text.
"""

import mlx.core as mx
import numpy as np
import pytest

from mlxgraph.generation.sampling import Sampler, min_p_mask, top_k_mask, top_p_mask
from mlxgraph.generation.stop_text import StopText
from mlxgraph.interpreter.text.tokenizer import ByteTokenizer, TokenizerError, load_tokenizer


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


def test_min_p_keeps_tokens_near_the_top():
    logits = np.random.default_rng(4).standard_normal((3, 60)).astype(np.float32) * 3
    kept = np.isfinite(np.array(min_p_mask(mx.array(logits), 0.1)))
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    assert np.array_equal(kept, probs >= 0.1 * probs.max(-1, keepdims=True))
    row = logits[0]
    got = set(np.array(Sampler(1.0, min_p=0.1, seed=0)(mx.array(np.tile(row, (3000, 1))))).tolist())
    assert got == set(np.flatnonzero(kept[0]).tolist())


def test_sampler_rejects_bad_settings():
    for kw in ({"temperature": -1}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}, {"min_p": 1.0},
               {"repetition_penalty": 0.0}, {"temperature": float("nan")}):
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
    tok = load_tokenizer(None, folder=hf_folder)
    ids = tok.encode("once upon a héllo ✓ time")
    # transformers 5 ignores add_bos_token when tokenizer.json exists: its post-processor
    # (none here) decides, so no BOS (tests/test_chat.py checks against transformers itself)
    assert 1 not in ids
    dec = tok.stream_decoder()
    streamed = "".join(dec.add(t) for t in ids) + dec.flush()
    assert streamed == tok.decode(ids) == "once upon a héllo ✓ time"
    with pytest.raises(TokenizerError, match="not a folder"):
        load_tokenizer(None, folder=hf_folder / "missing")


def test_stop_strings_straddling_pieces():
    stops = StopText(["END", "\n\nUser:"])
    out, hit = [], False
    for piece in ["Hello", " wor", "ld\n", "\nUs", "er: no"]:
        text, hit = stops.feed(piece)
        out.append(text)
        if hit:
            break
    assert hit and "".join(out) == "Hello world"
    stops = StopText(["END"])
    assert stops.feed("abcE") == ("abc", False) and stops.feed("N") == ("", False)
    assert stops.feed("x") == ("ENx", False) and stops.flush() == ""
