"""`mlxgraph serve`'s routes beside completions: /tokenize and /detokenize (vLLM's
shapes), /v1/models/{id}, Prometheus /metrics (parsed by prometheus_client's own parser)
and /v1/embeddings (404 with the reason)."""

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import chat_graph, running_server

import mlxgraph

PROMPT = "Once upon a time there was a tiny model"


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return chat_graph(tmp_path_factory.mktemp("serve-endpoints") / "chat.mlxg")


@pytest.fixture(scope="module")
def server(graph):
    with running_server(graph) as s:
        yield s


def test_tokenize_and_detokenize_round_trip(server, graph):
    tok = mlxgraph.load(graph).tokenizer
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT, "model": "chat"}).json()
    assert r["tokens"] == tok.encode(PROMPT) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] > 0
    messages = [{"role": "user", "content": "Hello!"}]
    r = httpx.post(f"{server.url}/tokenize", json={"messages": messages}).json()
    assert r["tokens"] == tok.apply_chat_template(messages, add_generation_prompt=True)
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": tok.encode(PROMPT)}).json()
    assert back == {"prompt": tok.decode(tok.encode(PROMPT))}


@pytest.mark.parametrize("path, body, param", [
    ("tokenize", {"prompt": "x", "messages": []}, "prompt"),
    ("tokenize", {}, "prompt"),
    ("tokenize", {"prompt": "x", "max_tokens": 3}, "max_tokens"),
    ("tokenize", {"prompt": ["a", "b"]}, "prompt"),
    ("tokenize", {"prompt": "x", "model": "other"}, "model"),
    ("detokenize", {"tokens": [1, -1]}, "tokens"),
    ("detokenize", {"tokens": [10**6]}, "tokens"),
    ("detokenize", {"tokens": "12"}, "tokens"),
    ("detokenize", {"tokens": [1], "extra": 1}, "extra"),
])
def test_bad_tokenize_bodies_are_4xx_naming_the_field(server, path, body, param):
    r = httpx.post(f"{server.url}/{path}", json=body)
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text


def test_a_model_by_id_and_no_embeddings(server):
    client = server.client()
    assert client.models.retrieve("chat").id == "chat"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("other")
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="chat", input="x")
    assert "no embeddings" in e.value.body["message"]


def test_metrics_parse_and_count(server):
    client = server.client()
    for _ in range(2):  # the second forks the first's kept session: a prefix hit
        client.completions.create(model="chat", prompt=PROMPT, max_tokens=4, n=2,
                                  temperature=0)
    text = httpx.get(f"{server.url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    value = {s.name: s.value for f in families.values() for s in f.samples}
    assert value["mlxgraph_requests_total"] >= 2 and value["mlxgraph_prefix_hits_total"] >= 1
    assert value["mlxgraph_completion_tokens_total"] >= 16
    assert value["mlxgraph_waiting"] == 0 and value["mlxgraph_active"] == 0
    assert value["mlxgraph_time_to_first_token_seconds_count"] >= 4
    assert value["mlxgraph_request_duration_seconds_count"] >= 4
    assert families["mlxgraph_decode_batch_rows"].type == "histogram"
    assert value["mlxgraph_decode_batch_rows_sum"] >= 2  # two rows stepped together
    stats = httpx.get(f"{server.url}/stats").json()
    assert stats["completion_tokens"] == value["mlxgraph_completion_tokens_total"]
