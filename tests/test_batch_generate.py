"""``mlxgraph.batch_generate``: prompts decoded together in batched steps give what
``mlxgraph.generate`` gives each prompt alone (the oracle), rows leaving the batch as they
end (EOS, stop string, max_tokens, a full cache), in prompt order."""

import pytest
from tool_helpers import synthetic_graph

import mlxgraph

PROMPTS = ["Hello", [1, 7, 42, 99, 5, 200, 17, 3, 9], "Once upon a time, there"]


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    program = mlxgraph.load(synthetic_graph(tmp_path_factory.mktemp("batchgen") / "syn.mlxg"))
    assert program.batching.problem is None  # the rows really go in batched steps
    return program


def _solo(program, prompts, **options):
    return [mlxgraph.generate(program, p, **options) for p in prompts]


def _same(batch, solo):
    assert len(batch) == len(solo)
    for b, s in zip(batch, solo):
        assert isinstance(b, mlxgraph.GenerationResult)
        assert (b.prompt_ids, b.token_ids, b.text, b.stop_reason) == (
            s.prompt_ids, s.token_ids, s.text, s.stop_reason)
        assert b.stats.generated_tokens == len(b.token_ids)
        assert b.stats.prompt_tokens == len(b.prompt_ids) and b.stats.stop_reason == b.stop_reason


def test_greedy_equals_generate_alone_with_an_early_eos(program):
    free = _solo(program, PROMPTS, max_tokens=12, ignore_eos=True)
    ids = free[1].token_ids
    # an id the second prompt reaches at its 4th token (and not before): it stops there
    k = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])
    options = {"max_tokens": 12, "ignore_eos": True, "extra_eos": [ids[k]]}
    solo = _solo(program, PROMPTS, **options)
    assert solo[1].stop_reason == "eos" and len(solo[1].token_ids) == k + 1
    assert any(s.stop_reason == "max_tokens" for s in solo)
    _same(mlxgraph.batch_generate(program, PROMPTS, **options), solo)
    _same(mlxgraph.batch_generate(program, PROMPTS, prefill_chunk=2, **options), solo)


def test_stop_strings_and_capacity_end_rows_as_alone(program):
    free = _solo(program, PROMPTS, max_tokens=10, ignore_eos=True)
    stop = next(t[3:5] for t in (r.text for r in free) if len(t[3:5].strip()) == 2)
    options = {"max_tokens": 10, "ignore_eos": True, "stop": [stop], "capacity": 28}
    solo = _solo(program, PROMPTS, **options)
    reasons = {s.stop_reason for s in solo}
    assert "stop_string" in reasons and "capacity" in reasons
    _same(mlxgraph.batch_generate(program, PROMPTS, **options), solo)


def test_seeded_sampling_is_reproducible_and_per_prompt_as_alone(program):
    options = {"max_tokens": 8, "ignore_eos": True, "temp": 0.9, "top_p": 0.95, "seed": 3}
    first = mlxgraph.batch_generate(program, PROMPTS, **options)
    _same(mlxgraph.batch_generate(program, PROMPTS, **options), first)
    _same(first, _solo(program, PROMPTS, **options))


def test_one_prompt_and_none(program):
    _same(mlxgraph.batch_generate(program, PROMPTS[:1], max_tokens=5),
          _solo(program, PROMPTS[:1], max_tokens=5))
    assert mlxgraph.batch_generate(program, [], max_tokens=5) == []


@pytest.mark.parametrize("prompts, error, message", [
    ("Hello", TypeError, "prompts must be a list of prompts"),
    ([1, 2, 3], TypeError, "prompts must be a list of prompts"),
    ([{"role": "user", "content": "hi"}], TypeError, "prompts must be a list of prompts"),
    (["Hello", [1, 999]], ValueError, "token id 999 is outside the vocabulary"),
])
def test_bad_prompts_refused(program, prompts, error, message):
    with pytest.raises(error, match=message):
        mlxgraph.batch_generate(program, prompts, max_tokens=3)


def test_bad_options_refused_before_any_step(program):
    with pytest.raises(mlxgraph.OptionError, match="seed"):
        mlxgraph.batch_generate(program, PROMPTS, seed=1)
    with pytest.raises(ValueError, match="max_tokens"):
        mlxgraph.batch_generate(program, PROMPTS, max_tokens=0)
    with pytest.raises(TypeError):
        mlxgraph.batch_generate(program, PROMPTS, sampler=object())
