"""`mlxgraph serve`'s choices: ``n`` (forks of one prefilled prompt), a list of prompts
(each its own choices), ``echo``, and ``chat_template_kwargs``. The oracle of a choice is a
solo ``mlxgraph.generate`` of its prompt with its seed (``seed + j`` for choice j)."""

import httpx
import openai
import pytest
from serve_helpers import TEMPLATE, chat_graph, running_server

import mlxgraph

CHUNK = 16
PROMPT = "Once upon a time there was a tiny model"
HINTED = TEMPLATE.replace("{{ bos_token }}", "{{ bos_token }}{% if hint %}{{ hint }}{% endif %}")


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return chat_graph(tmp_path_factory.mktemp("serve-choices") / "chat.mlxg", template=HINTED)


@pytest.fixture(scope="module")
def program(graph):
    return mlxgraph.load(graph)


@pytest.fixture(scope="module")
def server(graph):
    with running_server(graph, "--prefill-chunk", CHUNK, "--max-sessions", 8) as s:
        yield s


def solo(program, prompt, **kw):
    return mlxgraph.generate(program, prompt, prefill_chunk=CHUNK, chat_template=False,
                             **kw).text


def test_n_choices_are_forks_sampling_seed_plus_j(server, program):
    want = [solo(program, PROMPT, max_tokens=10, temperature=1.5, seed=7 + j) for j in range(4)]
    assert len(set(want)) > 1
    client = server.client()
    before = httpx.get(f"{server.url}/stats").json()
    r = client.completions.create(model="chat", prompt=PROMPT, max_tokens=10, temperature=1.5,
                                  seed=7, n=4)
    after = httpx.get(f"{server.url}/stats").json()
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == want
    ids = program.tokenizer.encode(PROMPT)
    assert r.usage.prompt_tokens == len(ids)  # the prompt once
    assert r.usage.completion_tokens == 40  # no EOS in ten tokens here
    assert [c.finish_reason for c in r.choices] == ["length"] * 4
    # the prompt went through the model once: the forks took it all
    assert after["prompt_tokens"] - before.get("prompt_tokens", 0) == len(ids)
    stream = client.completions.create(model="chat", prompt=PROMPT, max_tokens=10,
                                       temperature=1.5, seed=7, n=4, stream=True,
                                       stream_options={"include_usage": True})
    texts, finished, usage = ["", "", "", ""], set(), None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        c = chunk.choices[0]
        texts[c.index] += c.text
        if c.finish_reason:
            finished.add(c.index)
    assert texts == want and finished == {0, 1, 2, 3}
    assert usage.completion_tokens == r.usage.completion_tokens


def test_prompt_lists_with_n_and_echo(server, program):
    prompts = [PROMPT, "Hello! How are you"]
    client = server.client()
    r = client.completions.create(model="chat", prompt=prompts, max_tokens=6, temperature=0,
                                  n=2, echo=True)
    greedy = [solo(program, p, max_tokens=6) for p in prompts]
    assert [c.text for c in r.choices] == [p + g for p, g in zip(prompts, greedy) for _ in "ab"]
    assert r.usage.prompt_tokens == sum(len(program.tokenizer.encode(p)) for p in prompts)
    ids = program.tokenizer.encode(prompts[1])
    r = client.completions.create(model="chat", prompt=[ids], max_tokens=6, temperature=0,
                                  echo=True, stream=True)
    assert "".join(c.choices[0].text for c in r) == prompts[1] + greedy[1]


def test_chat_n_and_template_kwargs(server, program):
    tok = program.tokenizer
    messages = [{"role": "user", "content": "Hello!"}]
    client = server.client()
    r = client.chat.completions.create(model="chat", messages=messages, max_tokens=5,
                                       temperature=0, n=2)
    assert r.choices[0].message.content == r.choices[1].message.content
    hinted = client.chat.completions.create(
        model="chat", messages=messages, max_tokens=5, temperature=0,
        extra_body={"chat_template_kwargs": {"hint": "Be brief."}})
    want = len(tok.apply_chat_template(messages, add_generation_prompt=True, hint="Be brief."))
    assert hinted.usage.prompt_tokens == want > r.usage.prompt_tokens


@pytest.mark.parametrize("path, body, param, words", [
    ("completions", {"prompt": "x", "n": 9}, "n", "9 choices"),
    ("completions", {"prompt": ["x"] * 5, "n": 2}, "n", "10 choices"),
    ("completions", {"prompt": ["x"] * 9}, "prompt", "9 choices"),
    ("completions", {"prompt": "x", "n": 0}, "n", "[1, 128]"),
    ("completions", {"prompt": "x", "echo": True, "logprobs": 2}, "echo", "not supported"),
    ("completions", {"prompt": "x", "best_of": 2}, "best_of", "not supported"),
    ("completions", {"prompt": [], "n": 1}, "prompt", "non-empty"),
    ("chat/completions", {"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs",
     "'messages' is not a template variable"),
    ("chat/completions", {"chat_template_kwargs": {"bos_token": "x"}}, "chat_template_kwargs",
     "special token"),
    ("chat/completions", {"chat_template_kwargs": [1]}, "chat_template_kwargs", "an object"),
])
def test_bad_choices_are_400_naming_the_field(server, path, body, param, words):
    if path.startswith("chat"):
        body = {"messages": [{"role": "user", "content": "x"}], **body}
    r = httpx.post(f"{server.base}/{path}", json={"max_tokens": 1, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"]


def test_the_openai_client_refuses_nothing_it_sends(server):
    with pytest.raises(openai.BadRequestError):
        server.client().completions.create(model="chat", prompt="x", max_tokens=1, n=20)
