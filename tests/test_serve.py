"""`mlxgraph serve` with the `openai` package as the client: completions and chat, streaming
and not, stop strings, log-probabilities, concurrent streams, and prefix reuse across chat
turns; the oracle is a solo ``mlxgraph.generate`` (or ``ChatSession``) of the same prompt
in this process, with the server's prefill chunk.
"""

import random
import threading

import pytest
from serve_helpers import chat_graph, running_server

import mlxgraph

CHUNK = 16  # the servers' --prefill-chunk: prompts here span several chunks
FINISH = {"eos": "stop", "stop_string": "stop", "max_tokens": "length", "capacity": "length"}


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return chat_graph(tmp_path_factory.mktemp("serve") / "chat.mlxg")


@pytest.fixture(scope="module")
def program(graph):
    return mlxgraph.load(graph)


@pytest.fixture(scope="module")
def server(graph):
    with running_server(graph, "--prefill-chunk", CHUNK, "--max-tokens", 64) as s:
        yield s


def solo(program, prompt, n, **kw):
    """(text, finish_reason, completion tokens) of a solo greedy generate."""
    r = mlxgraph.generate(program, prompt, max_tokens=n, prefill_chunk=CHUNK, **kw)
    return r.text, FINISH[r.stop_reason], len(r.token_ids)


def test_models_health_and_unknown_routes(server):
    client = server.client()
    assert [m.id for m in client.models.list().data] == ["chat"]
    import httpx

    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    r = httpx.get(f"{server.url}/v1/nothing")
    assert r.status_code == 404 and "message" in r.json()["error"]


def test_completion_whole_and_streamed_equal_a_solo_generate(server, program):
    client = server.client()
    prompt = "Once upon a time there was a tiny model"
    text, finish, n = solo(program, prompt, 40, chat_template=False)
    r = client.completions.create(model="chat", prompt=prompt, max_tokens=40, temperature=0)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (text, finish)
    ids = program.tokenizer.encode(prompt)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), n)
    stream = client.completions.create(model="chat", prompt=prompt, max_tokens=40, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish
    assert chunks[-1].usage.completion_tokens == n and not chunks[-1].choices
    # The second request extends the first one's kept session: its prompt came from there.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == len(ids) - 1


def test_chat_whole_and_streamed_equal_a_solo_generate(server, program):
    client = server.client()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    text, finish, n = solo(program, messages, 30)
    r = client.chat.completions.create(model="chat", messages=messages, max_tokens=30,
                                       temperature=0)
    assert r.choices[0].message.content == text and r.choices[0].finish_reason == finish
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens == n
    chunks = list(client.chat.completions.create(model="chat", messages=messages, max_tokens=30,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == finish


def test_stop_strings_end_the_text_before_them(server, program):
    client = server.client()
    prompt = "Hello! How are you today?"
    full, _, _ = solo(program, prompt, 40, chat_template=False, ignore_eos=True)
    stop = next(full[i : i + 2] for i in range(3, len(full) - 2) if full[i : i + 2].strip())
    expected = full[: full.index(stop)]
    for stream in (False, True):
        r = client.completions.create(model="chat", prompt=prompt, max_tokens=40, temperature=0,
                                      stop=[stop, "never appears"], stream=stream)
        if stream:
            chunks = list(r)
            text = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            text, reason = r.choices[0].text, r.choices[0].finish_reason
        if full.index(stop) < len(full):
            assert (text, reason) == (expected, "stop")


def test_logprobs_are_the_model_distribution(server, program):
    import mlx.core as mx

    client = server.client()
    prompt = "The server answers"
    r = client.completions.create(model="chat", prompt=prompt, max_tokens=3, temperature=0,
                                  logprobs=3)
    lp = r.choices[0].logprobs
    # (a dict by token text: two ids of one text, e.g. partial UTF-8, share an entry)
    assert len(lp.token_logprobs) == 3 and all(1 <= len(t) <= 3 for t in lp.top_logprobs)
    ids = program.tokenizer.encode(prompt)
    logits = program.session().step(mx.array([ids], dtype=mx.int32), range(len(ids)))[0, -1]
    logp = logits - mx.logsumexp(logits)
    best = int(mx.argmax(logp).item())
    assert lp.token_logprobs[0] == pytest.approx(float(logp[best].item()), abs=1e-4)
    assert max(lp.top_logprobs[0].values()) == pytest.approx(lp.token_logprobs[0], abs=1e-6)
    chat = client.chat.completions.create(model="chat", messages=[{"role": "user",
                                          "content": "Hi"}], max_tokens=2, temperature=0,
                                          logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert content and all(len(c.top_logprobs) == 2 for c in content)


def test_chat_of_five_turns_prefills_only_the_new_tokens(graph, program):
    """Each turn re-sends the conversation; the server forks the kept session and feeds only
    the rest (usage, /stats and the log say so), and the answers are ChatSession's."""
    import httpx

    chat = mlxgraph.ChatSession(program, program.tokenizer, program.session(),
                                max_tokens=12, prefill_chunk=CHUNK)
    messages, previous_prompt, reused = [], 0, 0
    with running_server(graph, "--prefill-chunk", CHUNK) as server:
        client = server.client()
        for turn, text in enumerate(["Hello!", "How are you?", "Tell me more.", "Why?", "Bye."]):
            expected = chat.send(text)
            messages.append({"role": "user", "content": text})
            r = client.chat.completions.create(model="chat", messages=messages, max_tokens=12,
                                               temperature=0)
            answer = r.choices[0].message.content
            assert answer == expected, f"turn {turn}"
            cached = r.usage.prompt_tokens_details.cached_tokens
            if turn:  # the whole previous prompt came from the kept session
                assert previous_prompt <= cached < r.usage.prompt_tokens
            messages.append({"role": "assistant", "content": answer})
            previous_prompt, reused = r.usage.prompt_tokens, reused + cached
        stats = httpx.get(f"{server.url}/stats").json()
    assert stats["reused_tokens"] == reused > 0 and stats["requests"] == 5
    assert sum(f"({n} reused)" in "".join(server.log) for n in (0, reused)) >= 1


def _stream_all(server, prompts, n):
    """Stream every prompt from its own thread and client at once; {i: (text, finish, n)}."""
    results, barrier = {}, threading.Barrier(len(prompts))

    def one(i):
        client = server.client(timeout=120)
        barrier.wait()
        chunks = list(client.completions.create(
            model="chat", prompt=prompts[i], max_tokens=n, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        results[i] = (text, finish, chunks[-1].usage.completion_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return results


def concurrent_streams_equal_solo(graph, program, clients, n):
    # Token-id prompts of 3..60 tokens (some span several chunks), no two sharing a first
    # token, on a server that keeps no sessions: every stream is its own from the start.
    rng = random.Random(clients)
    vocab = program.metadata.vocab_size
    firsts = rng.sample(range(5, vocab), clients)
    prompts = [[f] + [rng.randrange(5, vocab) for _ in range(rng.randrange(2, 60))]
               for f in firsts]
    import httpx

    with running_server(graph, "--prefill-chunk", CHUNK, "--cache-memory", 0) as server:
        got = _stream_all(server, prompts, n)
        stats = httpx.get(f"{server.url}/stats").json()
    assert len(got) == clients
    # The streams' decode steps went in together (Program.step_batch), not one by one.
    assert stats["decode_rows"] > stats["decode_steps"] > 0 and stats["batch_fallbacks"] == 0
    for i, prompt in enumerate(prompts):
        assert got[i] == solo(program, prompt, n), f"client {i}"


def test_four_concurrent_streams_equal_solo_generates(graph, program):
    concurrent_streams_equal_solo(graph, program, 4, 24)


@pytest.mark.slow
def test_sixteen_concurrent_streams_equal_solo_generates(graph, program):
    concurrent_streams_equal_solo(graph, program, 16, 48)
