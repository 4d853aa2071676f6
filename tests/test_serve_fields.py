"""`mlxgraph serve`'s OpenAI fields beyond the basics: server-wide sampling defaults (--temp,
--top-k, --top-p, --min-p, --seed), logit_bias and the presence and frequency penalties.
The oracle of a greedy answer is a solo ``mlxgraph.generate`` of the same prompt in this
process (the library's sampler: tests/test_sampling.py checks it against numpy).
"""

import httpx
import openai
import pytest
from serve_helpers import chat_graph, running_server
from tool_helpers import run_cli

import mlxgraph
from mlxgraph.tools.serve.openai_requests import parse_chat, parse_completion

CHUNK = 16
PROMPT = "Once upon a time there was a tiny model"


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return chat_graph(tmp_path_factory.mktemp("serve-fields") / "chat.mlxg")


@pytest.fixture(scope="module")
def program(graph):
    return mlxgraph.load(graph)


def test_a_request_without_a_field_gets_the_server_default():
    defaults = {"temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 3}
    req = parse_completion({"prompt": "x"}, defaults)
    assert (req.temperature, req.top_k, req.top_p, req.min_p, req.seed) == (0.7, 40, 0.9, 0.05, 3)
    # A field the request gives wins over the server's.
    req = parse_chat({"messages": [{"role": "user", "content": "x"}], "top_k": 5, "seed": 9,
                      "temperature": 1.5}, defaults)
    assert (req.temperature, req.top_k, req.top_p, req.seed) == (1.5, 5, 0.9, 9)
    # Without server defaults: OpenAI's (temperature 1.0, no filters, a random seed).
    req = parse_completion({"prompt": "x"})
    assert (req.temperature, req.top_k, req.top_p, req.min_p, req.seed) == (1.0, 0, 1.0, 0.0,
                                                                              None)


def test_a_greedy_request_gets_none_of_the_server_s_filters():
    defaults = {"top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 3}
    req = parse_completion({"prompt": "x", "temperature": 0}, defaults)
    assert (req.temperature, req.top_k, req.top_p, req.min_p, req.seed) == (0.0, 0, 1.0, 0.0,
                                                                              None)
    # A greedy request's own filters and seed are accepted (OpenAI clients send them with
    # temperature 0) and change nothing, as docs/serve.md says; the penalties stay.
    req = parse_completion({"prompt": "x", "top_k": 7, "top_p": 0.5, "seed": 1,
                            "frequency_penalty": 1.0}, {"temperature": 0.0})
    assert (req.temperature, req.top_k, req.top_p, req.min_p, req.seed) == (0.0, 0, 1.0, 0.0,
                                                                              None)
    assert req.frequency_penalty == 1.0


@pytest.mark.parametrize("flags, message", [
    (["--min-p", "1.5"], "--min-p must be a number in [0, 1), got 1.5"),
    (["--top-p", "0"], "argument --top-p"),
    (["--temp", "-1"], "argument --temperature/--temp"),
    (["--seed", "x"], "argument --seed"),
    # server-wide defaults that greedy requests would ignore: refused as generate refuses them
    (["--temp", "0", "--top-p", "0.9"], "--top-p has no effect with temperature 0"),
    (["--temp", "0", "--seed", "1"], "--seed has no effect with temperature 0"),
])
def test_bad_default_flags_are_usage_errors(capsys, flags, message):
    code, out, err = run_cli(capsys, "serve", "g.mlxg", *flags)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err


def test_server_defaults_end_to_end(graph, program):
    greedy = mlxgraph.generate(program, PROMPT, max_tokens=12, prefill_chunk=CHUNK,
                               chat_template=False).text
    with running_server(graph, "--prefill-chunk", CHUNK, "--temp", 0) as server:
        client = server.client()
        r = client.completions.create(model="chat", prompt=PROMPT, max_tokens=12)
        assert r.choices[0].text == greedy
    with running_server(graph, "--prefill-chunk", CHUNK, "--temp", 5, "--seed", 11) as server:
        client = server.client()
        texts = {client.completions.create(model="chat", prompt=PROMPT, max_tokens=12,
                                           ).choices[0].text for _ in range(2)}
        assert len(texts) == 1 and texts != {greedy}  # the server's seed, at temperature 5
        other = client.completions.create(model="chat", prompt=PROMPT, max_tokens=12, seed=12)
        assert {other.choices[0].text} != texts  # the request's own seed wins
        r = client.completions.create(model="chat", prompt=PROMPT, max_tokens=12, temperature=0)
        assert r.choices[0].text == greedy
        # what OpenAI clients send: a greedy request with a seed and top_p is served, greedy
        r = client.completions.create(model="chat", prompt=PROMPT, max_tokens=12, temperature=0,
                                      seed=5, top_p=0.1)
        assert r.choices[0].text == greedy


@pytest.fixture(scope="module")
def server(graph):
    with running_server(graph, "--prefill-chunk", CHUNK, "--max-tokens", 64) as s:
        yield s


def test_penalties_equal_the_library_s(server, program):
    settings = {"frequency_penalty": 2.0, "presence_penalty": 0.5}
    plain = mlxgraph.generate(program, PROMPT, max_tokens=24, prefill_chunk=CHUNK,
                              chat_template=False, ignore_eos=True).text
    want = mlxgraph.generate(program, PROMPT, max_tokens=24, prefill_chunk=CHUNK,
                             chat_template=False, ignore_eos=True, **settings).text
    assert want != plain  # the penalties change this answer
    client = server.client()
    r = client.completions.create(model="chat", prompt=PROMPT, max_tokens=24, temperature=0,
                                  extra_body={"ignore_eos": True}, **settings)
    assert r.choices[0].text == want
    chunks = client.completions.create(model="chat", prompt=PROMPT, max_tokens=24, stream=True,
                                       temperature=0, extra_body={"ignore_eos": True},
                                       **settings)
    assert "".join(c.choices[0].text for c in chunks) == want


def test_logit_bias_forces_and_bans_tokens(server, program):
    client = server.client()
    tok = program.tokenizer
    forced = tok.encode(" time")[-1]
    r = client.completions.create(model="chat", prompt=PROMPT, max_tokens=5, temperature=1.0,
                                  logit_bias={str(forced): 100})
    assert r.choices[0].text == tok.decode([forced] * 5)
    greedy = tok.encode(mlxgraph.generate(program, PROMPT, max_tokens=1, prefill_chunk=CHUNK,
                                          chat_template=False).text)[0]
    r = client.completions.create(model="chat", prompt=PROMPT, max_tokens=1, temperature=0,
                                  logit_bias={str(greedy): -100})
    assert tok.encode(r.choices[0].text)[0] != greedy
    r = client.chat.completions.create(model="chat", max_tokens=3, temperature=0, messages=[
        {"role": "user", "content": "Hello!"}], logit_bias={str(forced): 100})
    assert r.choices[0].message.content == tok.decode([forced] * 3)


@pytest.mark.parametrize("field, value, words", [
    ("logit_bias", {"abc": 1}, "keys must be token ids"),
    ("logit_bias", {"5": 200}, "values must be numbers in [-100, 100], got 200 for token 5"),
    ("logit_bias", {"999": 1}, "token id 999 is outside the vocabulary [0, "),
    ("presence_penalty", 3, "must be a number in [-2.0, 2.0], got 3"),
    ("frequency_penalty", -2.5, "must be a number in [-2.0, 2.0]"),
])
def test_bad_penalties_and_biases_are_400_naming_the_field(server, field, value, words):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model="chat", prompt="x", max_tokens=1,
                                           **{field: value})
    assert e.value.body["param"] == field and words in e.value.body["message"]
    r = httpx.post(f"{server.base}/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field
