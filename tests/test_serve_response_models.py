"""A running server's answers match the response models declared in response_models.py:
each wire document (whole bodies, every stream chunk, errors, the model list, /tokenize,
/detokenize) validates against its model and dumps back to itself (no undeclared field, no
null where a field is left out), and OpenAI's own types (the ``openai`` package) accept it;
the real ``openai`` client reads them."""

import json

import httpx
import openai
import pytest
from openai.types import Completion as OpenAICompletion
from openai.types import Model as OpenAIModel
from openai.types.chat import ChatCompletion as OpenAIChat
from openai.types.chat import ChatCompletionChunk as OpenAIChunk
from openai.types.shared import ErrorObject
from pydantic import ValidationError
from serve_helpers import chat_graph, running_server
from test_serve_tools import HERMES, WEATHER

from mlxgraph.tools.serve import response_models as m

MESSAGES = [{"role": "user", "content": "Hello! How are you today?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    graph = chat_graph(tmp_path_factory.mktemp("serve-responses") / "tiny.mlxg",
                       template=HERMES)
    with running_server(graph) as s:
        yield s


def conforms(model, wire: dict, theirs=None) -> None:
    """``wire`` is ``model``'s document exactly, and OpenAI's type ``theirs`` accepts it."""
    assert model.model_validate(wire).dump() == wire
    if theirs is not None:
        theirs.model_validate(wire)


def stream(server, path, body) -> list:
    """The documents of a stream's events ([DONE] last, checked and dropped)."""
    with httpx.stream("POST", f"{server.base}/{path}", json={**body, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_the_check_refuses_what_the_models_do_not_declare():
    doc = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "x",
           "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 0,
                                    "total_tokens": 1,
                                    "prompt_tokens_details": {"cached_tokens": 0}}}
    conforms(m.Completion, doc, OpenAICompletion)
    with pytest.raises(ValidationError):  # an undeclared field
        conforms(m.Completion, {**doc, "system_fingerprint": None})
    chunk = {**doc, "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": "a", "tool_calls": None}, "logprobs": None,
         "finish_reason": None}]}
    with pytest.raises(AssertionError):  # a null sent where the field is left out
        conforms(m.ChatCompletionChunk, chunk)
    del chunk["choices"][0]["delta"]["tool_calls"]
    conforms(m.ChatCompletionChunk, chunk, OpenAIChunk)


def test_whole_bodies(server):
    client = server.client()
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt="Once upon a time", max_tokens=6, logprobs=3, seed=1)
    conforms(m.Completion, raw.http_response.json(), OpenAICompletion)
    assert raw.parse().choices[0].logprobs.tokens
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, max_tokens=6, logprobs=True, top_logprobs=2, seed=1)
    doc = raw.http_response.json()
    conforms(m.ChatCompletion, doc, OpenAIChat)
    assert "tool_calls" not in doc["choices"][0]["message"]
    assert raw.parse().choices[0].logprobs.content[0].top_logprobs
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, tools=[WEATHER], tool_choice="required",
        max_tokens=120, seed=4)
    conforms(m.ChatCompletion, raw.http_response.json(), OpenAIChat)
    assert raw.parse().choices[0].message.tool_calls[0].function.name == "get_weather"


@pytest.mark.parametrize("path, body, model, theirs", [
    ("completions", {"prompt": "Once upon", "logprobs": 2}, m.CompletionChunk, None),
    ("chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 2},
     m.ChatCompletionChunk, OpenAIChunk),
    ("chat/completions", {"messages": MESSAGES, "tools": [WEATHER],
                          "tool_choice": "required"}, m.ChatCompletionChunk, OpenAIChunk),
])
def test_stream_chunks(server, path, body, model, theirs):
    # OpenAI's Completion type (which names completion chunks too) requires a finish_reason
    # that streamed chunks send as null: only the declared model checks those.
    chunks = stream(server, path, {"model": "tiny", "max_tokens": 120, "seed": 4, "n": 2,
                                   "stream_options": {"include_usage": True}, **body})
    for chunk in chunks:
        conforms(model, chunk, theirs)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    assert all("usage" not in c for c in chunks[:-1])
    assert {c["choices"][0]["finish_reason"] for c in chunks[:-1]} > {None}
    if "tools" in body:
        assert any("tool_calls" in c["choices"][0]["delta"] for c in chunks[:-1])
    elif "messages" in body:
        assert any(c["choices"][0]["logprobs"] for c in chunks[:-1])


def test_the_openai_client_reads_a_stream(server):
    chunks = list(server.client().chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=8, stream=True, seed=2))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("method, path, body, status", [
    ("POST", "/v1/completions", {"prompt": "x", "bogus": 1}, 400),
    ("POST", "/v1/chat/completions", {"model": "other", "messages": MESSAGES}, 404),
    ("GET", "/v1/nowhere", None, 404),
    ("POST", "/v1/embeddings", {"input": "x"}, 404),
    ("POST", "/tokenize", {"prompt": 3}, 400),
])
def test_errors(server, method, path, body, status):
    r = httpx.request(method, server.url + path, json=body, timeout=30)
    assert r.status_code == status
    conforms(m.ErrorBody, r.json())
    ErrorObject.model_validate(r.json()["error"])


def test_the_openai_client_reads_an_error(server):
    with pytest.raises(openai.NotFoundError) as e:
        server.client().completions.create(model="other", prompt="x", max_tokens=2)
    conforms(m.ErrorBody, e.value.response.json())
    assert e.value.code == "model_not_found"


def test_models_tokenize_and_detokenize(server):
    listed = server.client().models.with_raw_response.list()
    conforms(m.ModelList, listed.http_response.json())
    [card] = listed.parse().data
    one = httpx.get(f"{server.base}/models/tiny", timeout=30).json()
    conforms(m.ModelCard, one, OpenAIModel)
    assert card.id == one["id"] == "tiny"
    tokens = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hello"}, timeout=30).json()
    conforms(m.Tokenized, tokens)
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": tokens["tokens"]},
                      timeout=30).json()
    conforms(m.Detokenized, text)
    assert text == {"prompt": "Hello"}
