"""`mlxgraph serve`'s structured output: response_format json_object / json_schema and a
GBNF ``grammar``, enforced by constrained decoding (generation/constrained.py, llguidance).
A random tiny model follows any grammar only if the mask works: every answer here is
sampled, and every one must parse and validate. The schemas come from a seeded generator
(objects, bounded strings, enums, bounded integers, booleans, bounded arrays, nesting);
``valid`` checks exactly the keywords the generator writes (no validator dependency)."""

import json
import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_helpers import chat_graph, running_server

COUNT = 40  # schemas in `make test`; test_two_hundred_schemas (slow) runs 200


def schema_of(rng, depth=0) -> dict:
    """A random JSON schema whose every string, number and array is bounded."""
    kinds = ["string", "enum", "integer", "boolean", "array"] + (["object"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randrange(0, 8)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "a b", "é"], rng.randrange(1, 4))}
    if kind == "integer":
        lo = rng.randrange(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randrange(0, 1000)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        return {"type": "array", "items": schema_of(rng, depth + 1),
                "maxItems": rng.randrange(0, 4)}
    names = rng.sample(["name", "age", "ok", "tags", "city", "x", "y"], rng.randrange(1, 4))
    return {"type": "object", "properties": {n: schema_of(rng, depth + 1) for n in names},
            "required": names, "additionalProperties": False}


def valid(value, schema) -> bool:
    """``value`` against the generator's keywords."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema["type"]
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema["maxLength"]
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)
                and schema["minimum"] <= value <= schema["maximum"])
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return (isinstance(value, list) and len(value) <= schema["maxItems"]
                and all(valid(v, schema["items"]) for v in value))
    return (isinstance(value, dict) and set(value) == set(schema["required"])
            and all(valid(value[k], s) for k, s in schema["properties"].items()))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    graph = chat_graph(tmp_path_factory.mktemp("serve-grammar") / "chat.mlxg")
    with running_server(graph, "--max-tokens", 400) as s:
        yield s


def ask(server, i, schema) -> tuple:
    """(content, finish_reason) of a sampled chat answer under ``schema``."""
    fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}}
    r = httpx.post(f"{server.base}/chat/completions", timeout=300, json={
        "messages": [{"role": "user", "content": "Answer in JSON."}], "max_tokens": 400,
        "temperature": 1.0, "seed": i, "response_format": fmt})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


def check_schemas(server, count) -> None:
    rng = random.Random(33)
    schemas = [_object(rng) for _ in range(count)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: ask(server, *p), enumerate(schemas)))
    for schema, (text, finish) in zip(schemas, answers):
        assert finish == "stop", (schema, text)
        assert valid(json.loads(text), schema), (schema, text)


def _object(rng) -> dict:
    names = rng.sample(["name", "age", "ok", "tags", "city", "x", "y"], rng.randrange(1, 4))
    return {"type": "object", "properties": {n: schema_of(rng, 1) for n in names},
            "required": names, "additionalProperties": False}


def test_random_schemas_always_validate(server):
    check_schemas(server, COUNT)


@pytest.mark.slow
def test_two_hundred_schemas(server):
    check_schemas(server, 200)


def test_json_object_grammar_and_n_streamed(server):
    client = server.client()
    r = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=300, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop" or r.choices[0].finish_reason == "length"
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    yes_no = 'root ::= "yes" | "no" | "maybe so"'
    r = client.completions.create(model="chat", prompt="Is it?", max_tokens=20, n=4, seed=3,
                                  extra_body={"grammar": yes_no})
    assert {c.text for c in r.choices} <= {"yes", "no", "maybe so"}
    assert all(c.finish_reason == "stop" for c in r.choices)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    chunks = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=50, seed=1,
        stream=True, response_format={"type": "json_schema",
                                      "json_schema": {"name": "b", "schema": schema}})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(text) in ({"ok": True}, {"ok": False})


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}}, "response_format",
     "'response_format': "),
    ({"grammar": "root ::= missing"}, "grammar", "'grammar': "),
    ({"grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}}, "grammar",
     "not both"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos",
     "ends at the EOS token"),
])
def test_bad_grammars_are_400_naming_the_field(server, body, param, words):
    r = httpx.post(f"{server.base}/completions", json={"prompt": "x", "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"]
