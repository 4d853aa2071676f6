"""`mlxgraph serve` over a graph whose chat template turns hostile on some messages: those
requests get a JSON 400 within the tokenize timeout while other clients are served; a
flood of them parks no thread; a lone surrogate is a JSON 400; SIGTERM ends the process
within the shutdown timeout even while a template is still running."""

import concurrent.futures
import json
import signal
import threading
import time

import httpx
import pytest
from serve_helpers import TEMPLATE, chat_graph, running_server, start_server

HOSTILE = (
    "{% set last = messages[-1]['content'] %}"
    "{% if last == 'hang' %}{% for a in range(100000) %}{% for b in range(100000) %}"
    "{% endfor %}{% endfor %}"
    "{% elif last == 'boom' %}{{ '%0*d' % (10**9, 1) }}"
    "{% elif last == 'power' %}{{ 10 ** (10 ** 10) }}"
    "{% elif last == 'recurse' %}{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"
    "{% endif %}" + TEMPLATE
)
TIMEOUT = 1.0  # --tokenize-timeout of these servers


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return chat_graph(tmp_path_factory.mktemp("serve-hostile") / "chat.mlxg", HOSTILE)


def _chat(url, content, stream=False, timeout=30):
    body = {"model": "chat", "messages": [{"role": "user", "content": content}],
            "max_tokens": 4, "stream": stream}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)


def test_hostile_messages_fail_alone_while_others_are_served(graph):
    with running_server(graph, "--tokenize-timeout", TIMEOUT, "--max-tokens", 64) as server:
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            streaming = pool.submit(_chat, server.url, "Hello", True)
            hostile = {word: pool.submit(_chat, server.url, word)
                       for word in ("hang", "boom", "power", "recurse") * 2}
            started = time.monotonic()
            plain = [pool.submit(_chat, server.url, f"Hi {i}") for i in range(4)]
            assert all(f.result().status_code == 200 for f in plain)
            assert time.monotonic() - started < 20
            for word, future in hostile.items():
                r = future.result()
                assert r.status_code == 400, (word, r.text)
                error = r.json()["error"]
                assert error["param"] == "messages" and "chat template" in error["message"]
                assert "\n" not in error["message"]
            r = streaming.result()
            assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
        # A flood of never-ending templates, more than the tokenizing threads: each is
        # answered (400 at its deadline, or 503 when it waited past it for a thread)...
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda _: _chat(server.url, "hang"), range(10)))
        assert {r.status_code for r in answers} <= {400, 503}
        assert all("error" in r.json() for r in answers)
        # ...and no thread stays parked: the next requests are served at once.
        assert _chat(server.url, "Hello again").status_code == 200
        stats = httpx.get(f"{server.url}/stats").json()
        assert stats["active"] == 0 and stats["waiting"] == 0


@pytest.mark.parametrize("body", [
    b'{"model": "chat", "prompt": "a\\ud800b", "max_tokens": 2}',
    b'{"model": "chat", "messages": [{"role": "user", "content": "\\udfff"}]}',
])
def test_a_lone_surrogate_is_a_json_400(graph, body):
    with running_server(graph) as server:
        path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
        r = httpx.post(f"{server.url}{path}", content=body,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"], r.text
        assert httpx.post(f"{server.url}/v1/completions", json={
            "prompt": "a\U0001F600", "max_tokens": 2}).status_code == 200


def test_sigterm_exits_within_the_shutdown_timeout_while_a_template_runs(graph):
    server = start_server(graph, "--tokenize-timeout", 30, "--shutdown-timeout", 1)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(lambda: _chat(server.url, "hang", timeout=60))
        time.sleep(1.0)  # the template is running on a tokenizing thread
        started = time.monotonic()
        code = server.stop(signal.SIGTERM, timeout=30)
        elapsed = time.monotonic() - started
        try:
            pending.result()
        except httpx.HTTPError:
            pass  # the connection was closed without an answer: the server is gone
    assert code == 0 and elapsed < 1 + 2 + 1.5, (code, elapsed, "".join(server.log)[-2000:])
    assert json.dumps(server.log)  # the log was drained


def test_clients_that_go_away_are_one_log_line_each(graph):
    import socket

    def post(body: bytes, length=None):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n" % (length or len(body)) + body)
        return s

    with running_server(graph, "--max-tokens", 200) as server:
        post(b'{"prompt": ', length=1000).close()  # the body never comes
        stream = post(json.dumps({"prompt": "Hello", "max_tokens": 200, "stream": True,
                                  "ignore_eos": True}).encode())
        stream.recv(100)
        stream.close()  # mid-stream
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any("cancelled" in x for x in server.log):
            time.sleep(0.05)
        assert _chat(server.url, "Hello").status_code == 200
    text = "".join(server.log)
    assert "went away before its request was read" in text and "cancelled" in text, text
    assert "Traceback" not in text and "socket.send()" not in text, text


def test_a_slow_tokenizer_regex_costs_one_request_not_the_server(tmp_path):
    # Oniguruma stops an exponential regex, not a slow one: (a+)+$ takes 0.2 s on each run
    # of 22 'a'. The worker process running it is killed at the deadline.
    from hostile_tokenizers import document
    from tool_helpers import synthetic_graph

    graph = synthetic_graph(tmp_path / "slow.mlxg", tokenizer="embedded", vocab=300,
                            files={"tokenizer.json": document("regex slow")})
    with running_server(graph, "--tokenize-timeout", TIMEOUT) as server:
        slow = {"prompt": ("a" * 22 + "!") * 200, "max_tokens": 2}
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: httpx.post(
                f"{server.url}/v1/completions", json=slow, timeout=60), range(6)))
        for r in answers:
            assert r.status_code in (400, 503) and "error" in r.json(), r.text
        assert any("took more than" in r.json()["error"]["message"] for r in answers)
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hello", "max_tokens": 2},
                       timeout=60)
        assert r.status_code == 200, r.text


def test_streams_still_going_at_the_shutdown_timeout_end_with_an_error_event(graph):
    server = start_server(graph, "--shutdown-timeout", 1, "--max-tokens", 240)
    body = {"prompt": "Once", "max_tokens": 240, "stream": True, "ignore_eos": True}
    started = threading.Barrier(9)

    def stream():
        lines = []
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
            for i, line in enumerate(r.iter_lines()):
                if i == 0:
                    started.wait(30)
                if line:
                    lines.append(line)
        return lines

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(stream) for _ in range(8)]
        started.wait(30)  # every stream has its first token
        code = server.stop(signal.SIGTERM, timeout=30)
        ends = [f.result() for f in streams]
    assert code == 0
    assert all(lines[-1] == "data: [DONE]" for lines in ends if lines)
    cut = [lines for lines in ends if any("shutting down" in x for x in lines)]
    assert cut, "no stream was still going at the timeout"
    assert all(json.loads(lines[-2][6:])["error"]["type"] == "server_error" for lines in cut)


HOSTILE_GRAMMARS = [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema":
                         json.loads('{"type": "array", "items": ' * 200 + "{}" + "}" * 200)}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "enum", "schema": {
        "enum": [f"v{i}" for i in range(200000)]}}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "re", "schema": {
        "type": "string", "pattern": "(a+)+$"}}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "ints", "schema": {
        "type": "integer", "minimum": -10**30, "maximum": 10**30}}}},
    {"grammar": "(" * 5000 + "a" + ")*" * 5000},
    {"grammar": 'root ::= a\na ::= a "x" | "y"'},
]


def test_hostile_grammars_cost_their_request_only(graph):
    """Schemas and grammars past llguidance's limits are a 400 naming the field (or a 503 when
    compiling passed the deadline); a grammar it can follow is served; streams go on."""
    with running_server(graph, "--tokenize-timeout", 5) as server, \
            concurrent.futures.ThreadPoolExecutor(4) as pool:
        streaming = pool.submit(_chat, server.url, "Hello", True)
        answers = list(pool.map(lambda extra: httpx.post(
            f"{server.base}/completions", timeout=60,
            json={"prompt": "x", "max_tokens": 8, **extra}), HOSTILE_GRAMMARS))
        assert streaming.result().status_code == 200
        for extra, r in zip(HOSTILE_GRAMMARS, answers):
            assert r.status_code in (200, 400, 503), r.text
            if r.status_code == 400:
                assert r.json()["error"]["param"] == next(iter(extra)), r.text
        assert _chat(server.url, "Hi").status_code == 200
    assert "Traceback" not in "".join(server.log)
