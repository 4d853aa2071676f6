"""`mlxgraph serve`'s streams carry no empty deltas: a token that leaves a UTF-8 character
incomplete sends nothing until the character is whole (as mlx_lm.server and llama.cpp do).
The output is multi-byte by construction: a logit_bias of +100 on the byte tokens of
``aé日ж🙂中!`` makes the sampled tokens those bytes, so most tokens end mid-character."""

import pytest
from serve_helpers import chat_graph, running_server
from tool_helpers import synthetic_graph

import mlxgraph

TEXT = "aé日ж🙂中!"


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-stream")
    return synthetic_graph(root / "bytes.mlxg"), chat_graph(root / "chat.mlxg")


def _bias(tokenizer) -> dict:
    ids = {t for c in TEXT for t in tokenizer.encode(c, add_special_tokens=False)}
    return {str(t): 100 for t in ids}


def test_completion_stream_sends_only_whole_characters(graphs):
    bias = _bias(mlxgraph.load(graphs[0]).tokenizer)
    assert len(bias) == len(TEXT.encode())  # one token per byte
    with running_server(graphs[0]) as server:
        client = server.client()
        ask = dict(model="bytes", prompt="x", max_tokens=48, seed=5, logit_bias=bias)
        whole = client.completions.create(**ask)
        chunks = list(client.completions.create(**ask, stream=True))
    texts = [c.choices[0].text for c in chunks]
    assert "".join(texts) == whole.choices[0].text
    assert all(texts[:-1]), texts  # only the last chunk (the finish reason) may be empty
    assert chunks[-1].choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 48
    assert len(chunks) - 1 < 48 and any(len(t.encode()) > 1 for t in texts)


def test_chat_stream_sends_no_empty_content(graphs):
    bias = _bias(mlxgraph.load(graphs[1]).tokenizer)
    with running_server(graphs[1]) as server:
        client = server.client()
        ask = dict(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=40,
                   seed=2, logit_bias=bias)
        whole = client.chat.completions.create(**ask)
        chunks = list(client.chat.completions.create(**ask, stream=True))
    deltas = [c.choices[0].delta for c in chunks]
    assert deltas[0].role == "assistant" and deltas[-1].content is None
    middle = [d.content for d in deltas[1:-1]]
    assert all(middle), middle
    assert "".join(middle) == whole.choices[0].message.content
    assert len(middle) < whole.usage.completion_tokens
    assert any(len(t.encode()) > 1 for t in middle)
