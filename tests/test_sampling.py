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


def _openai_logits(logits, generated, presence, frequency, bias):
    """OpenAI's documented transform: mu[j] - c[j] * frequency - (c[j] > 0) * presence, plus
    the logit bias (numpy, float64)."""
    counts = np.bincount(np.asarray(generated, dtype=np.int64), minlength=logits.shape[-1])
    out = logits.astype(np.float64) - counts * frequency - (counts > 0) * presence
    for token, b in bias.items():
        out[..., token] += b
    return out


@pytest.mark.parametrize("presence, frequency, bias", [
    (0.0, 0.0, {3: 100.0, 7: -100.0}),
    (1.5, 0.0, {}),
    (0.0, 2.0, {}),
    (-2.0, 0.7, {0: 5.5, 49: -3.0}),
])
def test_penalties_and_logit_bias_match_openai_s_transform(presence, frequency, bias):
    """Step by step, over the tokens the sampler itself chose (greedy, so the choices are
    the oracle's argmax too): the adjusted logits and the token equal numpy's."""
    rng = np.random.default_rng(5)
    sampler = Sampler(presence_penalty=presence, frequency_penalty=frequency, logit_bias=bias)
    sampler.begin([1, 2, 3])  # the prompt's tokens are not penalised
    generated = []
    for _ in range(12):
        # A narrow spread, so a penalised favourite loses its place
        logits = (rng.standard_normal((1, 50)) * 0.5).astype(np.float32)
        logits[0, 11] += 3.0  # a favourite the frequency penalty must wear down
        want = _openai_logits(logits, generated, presence, frequency, bias)
        got = np.array(sampler.adjust(mx.array(logits)))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
        token = int(np.array(sampler(mx.array(logits)))[0])
        assert token == int(want.argmax()), generated
        generated.append(token)
    if frequency or presence:
        assert len(set(generated)) > 1  # the penalty changed the choice
    if bias.get(3) == 100.0:
        assert set(generated) == {3}  # +100 wins every step


def test_greedy_choice_sees_the_repetition_penalty():
    """CTRL's rule (numpy) over the prompt's and the generated tokens, under greedy choice:
    the penalty is accepted with temperature 0 because it changes the argmax."""
    rng = np.random.default_rng(7)
    sampler = Sampler(repetition_penalty=3.0, repetition_context=4)
    context, changed = [11, 12], False
    sampler.begin(context)
    for _ in range(10):
        logits = (rng.standard_normal((1, 40)) * 0.3).astype(np.float32)
        logits[0, 11] += 1.0  # a favourite in the prompt: the penalty must move the choice
        want = logits.astype(np.float64)
        recent = sorted(set(context[-4:]))
        want[0, recent] = np.where(want[0, recent] < 0, want[0, recent] * 3.0,
                                   want[0, recent] / 3.0)
        np.testing.assert_allclose(np.array(sampler.adjust(mx.array(logits))), want, atol=1e-6)
        token = int(np.array(sampler(mx.array(logits)))[0])
        assert token == int(want.argmax())
        changed |= token != int(logits.argmax())
        context.append(token)
    assert changed


def test_sampled_choice_sees_the_logit_bias():
    logits = mx.zeros((1, 64))
    sampler = Sampler(temperature=1.0, seed=3, logit_bias={5: -100.0, 9: 100.0})
    assert {int(np.array(sampler(logits))[0]) for _ in range(20)} == {9}
    banned = Sampler(temperature=1.0, seed=3, logit_bias=dict.fromkeys(range(63), -100.0))
    assert {int(np.array(banned(logits))[0]) for _ in range(20)} == {63}


def test_penalty_and_bias_settings_are_checked():
    from mlxgraph.generation.options import OptionError

    with pytest.raises(OptionError, match="presence_penalty must be a number in"):
        Sampler(presence_penalty=2.5)
    with pytest.raises(OptionError, match="frequency_penalty"):
        Sampler(frequency_penalty=float("nan"))
    with pytest.raises(OptionError, match=r"logit_bias values must be numbers in \[-100, 100\]"):
        Sampler(logit_bias={1: 101})
    with pytest.raises(OptionError, match="logit_bias keys must be token ids"):
        Sampler(logit_bias={-1: 1})
    with pytest.raises(OptionError, match=r"token id 64 is outside the vocabulary \[0, 64\)"):
        Sampler(logit_bias={64: 1.0})(mx.zeros((1, 64)))


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
