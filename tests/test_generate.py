"""`mlxgraph generate`: the pipelined loop and the command end to end (parts: test_sampling).

Oracles: a naive loop (a fresh session running the whole sequence for every token, no
cache reuse, no pipelining) for the generation loop; transformers' own greedy generation
of the built-in tiny-llama for the full path export -> graph -> `mlxgraph generate`.
"""

import json

import mlx.core as mx
import numpy as np
import pytest
from tool_helpers import exported_tiny_llama
from tool_helpers import generate_cli as _cli
from tool_helpers import synthetic_graph as _graph

import mlxgraph
from mlxgraph.generation.loop import GenerationStats, generate
from mlxgraph.generation.sampling import Sampler
from mlxgraph.schema.format import format_version

PROMPT = [1, 7, 42, 99, 5, 200]


# ---------------------------------------------------------------------------- the loop
@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return _graph(tmp_path_factory.mktemp("gen") / "syn.mlxg")


def _naive_greedy(program, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        logits = program.session().step(mx.array([seq], dtype=mx.int32), range(len(seq)))
        seq.append(int(np.array(logits[0, -1]).argmax()))
    return seq[len(prompt) :]


@pytest.fixture(scope="module")
def oracle(synthetic):
    program = mlxgraph.load(synthetic)
    return program, _naive_greedy(program, PROMPT, 13)


@pytest.mark.parametrize("chunk", [1, 2, 512])
def test_loop_matches_naive_greedy(oracle, chunk):
    program, want = oracle
    session = program.session()
    stats = GenerationStats()
    got = list(generate(session, PROMPT, Sampler(), 12, prefill_chunk=chunk, stats=stats))
    assert got == want[:12]
    assert len(set(got)) > 3  # a degenerate sequence would prove little
    assert stats.stop_reason == "max_tokens" and stats.generated_tokens == 12
    assert session.length == len(PROMPT) + 11  # the last token is never fed back
    # so the session continues exactly where it stopped
    logits = session.step(mx.array([[got[-1]]], dtype=mx.int32), [session.length])
    assert int(np.array(logits[0, -1]).argmax()) == want[12]


def test_loop_stops_at_stop_id(oracle):
    program, want = oracle
    stop = want[4]
    upto = want.index(stop) + 1
    session = program.session()
    stats = GenerationStats()
    got = list(generate(session, PROMPT, Sampler(), 12, stop_ids=[stop], stats=stats))
    assert got == want[:upto] and stats.stop_reason == "eos"
    # the step queued ahead on the stop token was rewound
    assert session.length == len(PROMPT) + upto - 1


def _holds_exactly(program, session, ids):
    """The session holds exactly ``ids``: its length, and its next step's logits equal a
    fresh session's over ``ids`` and that token in one step."""
    assert session.length == len(ids) - 1
    got = np.array(session.step(mx.array([ids[-1:]], dtype=mx.int32), [len(ids) - 1]))
    fresh = program.session().step(mx.array([ids], dtype=mx.int32), range(len(ids)))
    np.testing.assert_allclose(got[0, -1], np.array(fresh)[0, -1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("hook", [False, True], ids=["one-pass", "on_prefilled"])
@pytest.mark.parametrize("chunk", [4, 512])  # 4: the prompt in two chunks
def test_loop_edges_leave_the_history_exact(oracle, chunk, hook):
    """max_tokens 1..3, the consumer stopping after each token, a stop id first: every
    token is the naive loop's and the session holds the prompt and all of them but the last
    (the first token is handed over before step 2 is queued; the queued step is rewound)."""
    program, want = oracle
    kw = {"prefill_chunk": chunk, "on_prefilled": (lambda s: None) if hook else None}
    for max_tokens in (1, 2, 3):
        for stop_after in range(1, max_tokens + 1):
            session = program.session()
            steps = generate(session, PROMPT, Sampler(), max_tokens, **kw)
            got = [next(steps) for _ in range(stop_after)]
            steps.close()
            assert got == want[:stop_after], (max_tokens, stop_after)
            _holds_exactly(program, session, PROMPT + got)
    session, stats = program.session(), GenerationStats()
    got = list(generate(session, PROMPT, Sampler(), 5, stop_ids=[want[0]], stats=stats, **kw))
    assert got == want[:1] and stats.stop_reason == "eos" and stats.generated_tokens == 1
    _holds_exactly(program, session, PROMPT + got)


class _FailingSampler(Sampler):
    """Greedy, but its call number ``fail_at`` raises: after the step it samples from went
    into the session, as a Ctrl-C while a step is queued can."""

    def __init__(self, fail_at):
        super().__init__()
        self.calls, self.fail_at = 0, fail_at

    def __call__(self, logits):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt
        return super().__call__(logits)


@pytest.mark.parametrize("fail_at", [2, 3, 4])
def test_an_exception_while_queueing_leaves_the_history_exact(oracle, fail_at):
    """Sampling step 2 (queued after the first token is handed over), or a later step
    (queued before its token is read), fails after its step was fed: the session still
    holds the prompt and every token handed over but the last, not the step fed ahead."""
    program, want = oracle
    session, got = program.session(), []
    with pytest.raises(KeyboardInterrupt):
        for token in generate(session, PROMPT, _FailingSampler(fail_at), 8):
            got.append(token)
    assert got == want[: max(1, fail_at - 2)], got
    _holds_exactly(program, session, PROMPT + got)


def test_loop_sampling_reproducible(oracle):
    program, _ = oracle
    runs = [
        list(generate(program.session(), PROMPT, Sampler(0.9, top_k=20, top_p=0.95, seed=5), 10))
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def _penalised(logits, context, penalty):
    out = logits.copy()
    for t in set(context):
        out[t] = out[t] * penalty if out[t] < 0 else out[t] / penalty
    return out


def test_repetition_penalty_matches_the_host_rule(oracle):
    program, _ = oracle
    # Greedy with a penalty < 1 (it rewards repeats, so it surely changes the argmax),
    # against a naive host loop applying the rule to the last 20.
    seq, want = list(PROMPT), []
    for _ in range(10):
        logits = np.array(
            program.session().step(mx.array([seq], dtype=mx.int32), range(len(seq)))[0, -1]
        )
        token = int(_penalised(logits, seq[-20:], 0.2).argmax())
        want.append(token)
        seq.append(token)
    got = list(generate(program.session(), PROMPT, Sampler(repetition_penalty=0.2), 10))
    assert got == want
    assert got != list(generate(program.session(), PROMPT, Sampler(), 10))  # the penalty mattered


# ---------------------------------------------------------------------------- the command
def test_cli_json_stops_at_eos(tmp_path, oracle):
    _, want = oracle
    eos = want[6]
    graph = _graph(tmp_path / "eos.mlxg", eos=(eos,))
    proc = _cli(graph, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", 12, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["format_version"] == format_version() and doc["prompt_ids"] == PROMPT
    assert doc["token_ids"] == want[:want.index(eos) + 1] and doc["stop_reason"] == "eos"
    assert len(doc["token_ids"]) < 12
    stats = doc["stats"]
    assert stats["generated_tokens"] == len(doc["token_ids"]) and stats["prompt_tokens"] == len(
        PROMPT
    )
    assert stats["prefill_tokens_per_second"] > 0 and stats["peak_memory_bytes"] > 0
    assert stats["blas"]["name"]
    proc = _cli(
        graph,
        "--prompt-ids",
        ",".join(map(str, PROMPT)),
        "--max-tokens",
        12,
        "--json",
        "--ignore-eos",
    )
    assert json.loads(proc.stdout)["token_ids"] == want[:12]


def test_cli_stops_when_the_cache_is_full(synthetic, oracle):
    _, want = oracle
    # capacity 8, prompt 6: tokens 1..2 are fed back, token 3 need not be
    proc = _cli(
        synthetic,
        "--prompt-ids",
        ",".join(map(str, PROMPT)),
        "--max-tokens",
        12,
        "--capacity",
        8,
        "--json",
    )
    doc = json.loads(proc.stdout)
    assert doc["token_ids"] == want[:3] and doc["stop_reason"] == "capacity"


def test_cli_streams_text_and_stats(synthetic, oracle):
    _, want = oracle
    proc = _cli(synthetic, "--prompt", "Hi", "--max-tokens", 5, "--temperature", 0.8, "--seed", 1)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Hi")
    for key in (
        "prompt",
        "prefill",
        "decode",
        "tok/s",
        "peak memory",
        "BLAS",
        "seed 1",
        "stopped: max tokens",
    ):
        assert key in proc.stderr
    again = _cli(synthetic, "--prompt", "Hi", "--max-tokens", 5, "--temp", 0.8, "--seed", 1)
    assert again.stdout == proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.mlxg", "--prompt-ids", "1"], "no such file"),
        (["{g}", "--prompt-ids", "1,x"], "'x' is not an integer"),
        (["{g}", "--prompt-ids", "1,999"], "outside the vocabulary"),
        (["{g}", "--prompt-ids", "1,2,3,4", "--capacity", "3"], "more than the KV capacity"),
        (["{g}", "--prompt-ids", "1", "--max-tokens", "0"], "--max-tokens"),
        (["{g}", "--prompt-ids", "1", "--top-p", "0"], "top-p"),
        (["{bad}", "--prompt-ids", "1"], "bad.mlxg"),
    ],
)
def test_cli_bad_input_exits_2(tmp_path, synthetic, args, message):
    bad = tmp_path / "bad.mlxg"
    bad.write_bytes(b"not a graph file at all" * 4)
    args = [a.format(g=synthetic, bad=bad) for a in args]
    proc = _cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlxgraph: generate:") and message in lines[0], (
        proc.stderr
    )


def test_cli_bad_blas_env_exits_2(synthetic):
    proc = _cli(synthetic, "--prompt-ids", "1", env={"MLXGRAPH_BLAS": "/no/such/blas.so"})
    assert proc.returncode == 2 and "MLXGRAPH_BLAS" in proc.stderr


# ---------------------------------------------------------------------------- tiny-llama end to end
@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """(graph, transformers' greedy ids): the run's shared export and its model's decoding."""
    import torch

    from mlxgraph.exporter.builtins import builtin_model

    path = exported_tiny_llama(tmp_path_factory, ("float32",))["float32"]
    model = builtin_model("tiny-llama").float()
    ids = torch.tensor([[2] + list(b"Once upon a time")])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                             do_sample=False, eos_token_id=3, pad_token_id=0)
    return path, out[0, ids.shape[1]:].tolist()


def test_tiny_llama_matches_transformers_greedy(tiny_llama):
    path, reference = tiny_llama
    assert len(set(reference)) > 5
    proc = _cli(path, "--prompt", "Once upon a time", "--max-tokens", 24, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["prompt_ids"] == [2] + list(b"Once upon a time")
    assert doc["token_ids"] == reference
    assert doc["stop_reason"] == ("eos" if reference[-1] == 3 else "max_tokens")
    proc = _cli(
        path, "--prompt", "Once upon a time", "--max-tokens", 5, "--json", "--prefill-chunk", 4
    )
    doc = json.loads(proc.stdout)
    assert doc["token_ids"] == reference[:5] and doc["stop_reason"] == "max_tokens"
