"""`mlxgraph serve` under bad input and load: malformed requests answered 4xx (a seeded fuzz,
while another client streams undisturbed), 429 with Retry-After past the limits, a client
that disconnects frees its session, SIGTERM finishes the streams in flight and exits 0.
"""

import json
import random
import signal
import threading
import time

import httpx
import pytest
from serve_helpers import chat_graph, running_server, start_server

import mlxgraph

CHUNK = 16


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return chat_graph(tmp_path_factory.mktemp("serve-limits") / "chat.mlxg")


GOOD = {"model": "chat", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
GOOD_CHAT = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
WRONG_VALUES = {
    "max_tokens": ["4", 0, -1, 1.5, True, [4], 10**6],
    "temperature": ["hot", -0.5, [1], {"t": 1}, 1e9, True],
    "top_p": [0, 1.5, "x", -1],
    "top_k": [-1, 2.5, "k"],
    "min_p": [1.0, -0.1, "p"],
    "repetition_penalty": [0, -1, "r"],
    "seed": [-1, 1.5, "s", 2**70],
    "stop": [5, [1, 2], [""], ["x"] * 40, {"a": 1}, ["y" * 1000]],
    "stream": ["yes", 1, [True]],
    "stream_options": [{"include_usage": "x"}, 5, {"other": True}, {"include_usage": True}],
    "logprobs": [-1, 21, "3", 2.5],
    "n": [17, 0, "1", 200],  # 17: more choices than --max-sessions
    "echo": ["no", 1],
    "presence_penalty": [2.5, "x", -3],
    "frequency_penalty": [2.01, [1]],
    "logit_bias": [3, {"x": 1}, {"-5": 1}, {"5": 101}, {"5": "1"}, {"100000": 1}, {"5": True}],
    "model": [5, ["chat"], "another-model"],
    "prompt": ["", [], [-1], [10**9], [1.5], {"p": 1}, 7, [["a"]], ["a", ""], [[]],
               ["x"] * 17, "x" * 2000],
    "ignore_eos": ["true", 1],
    "best_of": [3],
    "suffix": ["tail"],
}
WRONG_CHAT = {
    "messages": [[], "hello", [{"role": "user"}], [{"role": "robot", "content": "x"}],
                 [{"content": "no role"}], [{"role": "user", "content": 5}],
                 [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
                 [{"role": "user", "content": "x", "tool_calls": []}], [5]],
    "logprobs": [3, "yes"],
    "top_logprobs": [5, -1, 21],
    "tools": [[{"type": "function"}]],
    "response_format": [{"type": "xml"}, {"type": "json_schema"}, {"type": "text", "x": 1},
                        {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                            "type": "nonsense"}}}],
    "grammar": [5, "root ::= undefined_rule"],
    "chat_template_kwargs": [[1], {"messages": 1}, {"not an identifier": 1}],
    "max_completion_tokens": [0, "9"],
}


def malformed_requests(n: int, seed: int = 0) -> list:
    """n (path, body bytes) requests that must each be refused with a 4xx."""
    rng = random.Random(seed)
    raw = json.dumps(GOOD).encode()
    makers = [
        lambda: raw[: rng.randrange(1, len(raw) - 1)],  # truncated JSON
        lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))),  # noise
        lambda: rng.choice([b"[]", b"5", b'"text"', b"null", b"true", b"{", b"\xff\xfe{}",
                            b"[" * 100000 + b"]" * 100000, b'{"prompt": NaN}']),
        lambda: json.dumps({**GOOD, f"unknown_{rng.randrange(99)}": 1}).encode(),
    ]
    out = []
    while len(out) < n:
        kind = rng.randrange(7)
        if kind == 6:  # a lone UTF-16 surrogate, escaped in the JSON, in some string field
            lone = rng.choice(["\ud800", "a\udfff", "\ud83d!"])
            chat = {**GOOD_CHAT, "messages": [{"role": "user", "content": lone}]}
            out.append(rng.choice([
                ("/v1/completions", json.dumps({**GOOD, "prompt": lone}).encode()),
                ("/v1/completions", json.dumps({**GOOD, "stop": [lone]}).encode()),
                ("/v1/completions", json.dumps({**GOOD, "model": lone}).encode()),
                ("/v1/completions", json.dumps({**GOOD, lone: 1}).encode()),
                ("/v1/chat/completions", json.dumps(chat).encode())]))
            continue
        if kind < 4:
            out.append(("/v1/completions", makers[kind]()))
        elif kind == 4:
            field = rng.choice(sorted(WRONG_VALUES))
            body = {**GOOD, field: rng.choice(WRONG_VALUES[field])}
            if field == "stream_options" and body[field] == {"include_usage": True}:
                body.pop("stream", None)  # stream_options without stream
            out.append(("/v1/completions", json.dumps(body).encode()))
        else:
            field = rng.choice(sorted(WRONG_CHAT))
            body = {**GOOD_CHAT, field: rng.choice(WRONG_CHAT[field])}
            out.append(("/v1/chat/completions", json.dumps(body).encode()))
    return out


def fuzz(graph, n):
    """n malformed requests, each answered 4xx with an OpenAI error body, while one client
    streams; the stream equals a solo generate and the server serves afterwards."""
    program = mlxgraph.load(graph)
    prompt = "Once upon a time there was a tiny model"
    solo = mlxgraph.generate(program, prompt, max_tokens=48, prefill_chunk=CHUNK,
                             chat_template=False, ignore_eos=True).text
    with running_server(graph, "--prefill-chunk", CHUNK, "--capacity", 128, "--max-tokens",
                        100) as server:
        streamed = []

        def stream():
            with httpx.stream("POST", f"{server.base}/completions", timeout=120, json={
                    "prompt": prompt, "max_tokens": 48, "temperature": 0, "stream": True,
                    "ignore_eos": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        streamed.append(json.loads(line[6:])["choices"][0]["text"])

        side = threading.Thread(target=stream)
        side.start()
        statuses = {}
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for path, body in malformed_requests(n):
                r = client.post(path, content=body, headers={"content-type": "application/json"})
                assert 400 <= r.status_code < 500, (body[:200], r.status_code, r.text[:300])
                assert r.json()["error"]["message"], body[:200]
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert client.get("/v1/completions").status_code == 405
            too_long = {**GOOD, "prompt": list(range(5, 5 + 129))}
            r = client.post("/v1/completions", json=too_long)
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
            r = client.post("/v1/completions", content=b"{" + b" " * (9 << 20) + b"}")
            assert r.status_code == 413
            assert client.post("/v1/completions", json=GOOD).status_code == 200
        side.join(120)
    assert "".join(streamed) == solo
    assert "Traceback" not in "".join(server.log)
    return statuses


def test_malformed_requests_get_4xx_and_disturb_no_stream(graph):
    statuses = fuzz(graph, 100)
    assert set(statuses) <= {400, 404} and statuses[400] > 80


@pytest.mark.slow
def test_a_thousand_malformed_requests(graph):
    statuses = fuzz(graph, 1000)
    assert sum(statuses.values()) == 1000


def test_past_the_limits_429_with_retry_after(graph):
    body = {**GOOD, "max_tokens": 40, "ignore_eos": True}
    with running_server(graph, "--max-sessions", 1, "--max-queue", 1) as server:
        results, barrier = [], threading.Barrier(6)

        def one():
            barrier.wait()
            results.append(httpx.post(f"{server.base}/completions", json=body, timeout=60))

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        busy = [r for r in results if r.status_code == 429]
        assert busy and all(r.headers["retry-after"] == "1" for r in busy)
        assert busy[0].json()["error"]["type"] == "rate_limit_error"
        assert {r.status_code for r in results} == {200, 429}
        done = [r.json() for r in results if r.status_code == 200]
        assert len({d["choices"][0]["text"] for d in done}) == 1  # all the same greedy answer


def _open_stream(server, max_tokens):
    """A streaming request and its line iterator, after the first chunk arrived."""
    client = httpx.Client(timeout=60)
    request = client.build_request("POST", f"{server.base}/completions", json={
        **GOOD, "max_tokens": max_tokens, "ignore_eos": True, "stream": True})
    response = client.send(request, stream=True)
    lines = response.iter_lines()
    assert next(line for line in lines if line.startswith("data: ")).startswith("data: {")
    return client, response, lines


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_client_that_disconnects_frees_its_session(graph):
    with running_server(graph, "--max-sessions", 1, "--max-queue", 0) as server:
        client, response, _ = _open_stream(server, 250)
        response.close()
        client.close()

        def freed():
            stats = httpx.get(f"{server.url}/stats").json()
            return stats["active"] == 0 and stats.get("cancelled") == 1

        _wait_for(freed)
        # The slot is free again at once: a new request is served, not refused.
        assert httpx.post(f"{server.base}/completions", json=GOOD).status_code == 200


def test_a_whole_request_whose_client_leaves_is_cancelled(graph):
    body = {**GOOD, "max_tokens": 250, "ignore_eos": True}
    with running_server(graph, "--max-sessions", 1, "--max-queue", 0) as server:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
            httpx.post(f"{server.base}/completions", json=body, timeout=0.05)

        def freed():
            stats = httpx.get(f"{server.url}/stats").json()
            return stats["active"] == 0 and stats.get("cancelled") == 1

        _wait_for(freed)


def test_sigterm_finishes_streams_in_flight_then_exits_0(graph):
    server = start_server(graph, "--shutdown-timeout", 30)
    try:
        client, response, lines = _open_stream(server, 100)
        server.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line]
        client.close()
        assert rest[-1] == "data: [DONE]"
        finish = [json.loads(x[6:])["choices"][0]["finish_reason"] for x in rest
                  if x.startswith("data: {")]
        assert finish[-1] == "length"
        server.proc.wait(30)
    finally:
        code = server.stop()
    assert code == 0 and "stopped" in "".join(server.log)
