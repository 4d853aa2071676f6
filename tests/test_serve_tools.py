"""`mlxgraph serve`'s tools: ``tools`` handed to the chat template as transformers does,
answers parsed for Hermes/Qwen ``<tool_call>`` blocks or Llama 3 JSON calls into
``tool_calls``, ``tool_choice`` "required" or a named function forcing a call by
constrained decoding, and ``tool`` messages in the history; with the openai client."""

import json

import httpx
import openai
import pytest
from serve_helpers import chat_graph, running_server

import mlxgraph
from mlxgraph.tools.serve.tool_calls import parse

HERMES = (
    "{{ bos_token }}{% if tools %}<|im_start|>system\nTools:{% for t in tools %} "
    "{{ t.function.name }}{% endfor %}. Call one as <tool_call>\n{\"name\": ..., "
    "\"arguments\": ...}\n</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n{{ c.function | tojson }}"
    "\n</tool_call>{% endfor %}{% elif m.role == 'tool' %}<tool_response>{{ m.content }}"
    "</tool_response>{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA = HERMES.replace("Call one as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n"
                       "</tool_call>", "Answer with JSON {\"name\": ..., \"parameters\": ...}")
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-tools")
    return chat_graph(root / "hermes.mlxg", template=HERMES), chat_graph(root / "llama.mlxg",
                                                                         template=LLAMA)


@pytest.fixture(scope="module")
def hermes(graphs):
    with running_server(graphs[0]) as server:
        yield server


def test_parse_hermes_and_llama3_calls():
    names = {"get_weather"}
    content, calls = parse('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": '
                           '{"city": "Paris"}}\n</tool_call>', names, "hermes")
    assert content == "Sure." and [json.loads(c.function.arguments) for c in calls] == [
        {"city": "Paris"}]
    content, calls = parse('<|python_tag|>{"name": "get_weather", "parameters": {"city": '
                           '"a;b"}}; {"name": "get_weather", "parameters": {}}', names, "llama3")
    assert content is None and len(calls) == 2
    assert json.loads(calls[0].function.arguments) == {"city": "a;b"}
    for text, style in [('{"name": "other", "parameters": {}}', "llama3"),
                        ('hi {"name": "get_weather", "parameters": {}}', "llama3"),
                        ("<tool_call>\n{broken\n</tool_call>", "hermes"),
                        ('<tool_call>\n{"name": "get_weather", "arguments": {}}', "hermes")]:
        assert parse(text, names, style) == (text, [])  # not a call: the text as it is


@pytest.mark.parametrize("which", [0, 1])
def test_a_tool_call_round_trip(graphs, which):
    graph = graphs[which]
    tok = mlxgraph.load(graph).tokenizer
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    with running_server(graph) as server:
        client = server.client()
        r = client.chat.completions.create(model=graph.stem, messages=messages, seed=4,
                                           tools=[WEATHER, TIME], tool_choice="required",
                                           max_tokens=120)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        call = choice.message.tool_calls[0]
        arguments = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert isinstance(arguments["city"], str) and len(arguments["city"]) <= 12
        else:
            assert arguments["zone"] in ("UTC", "CET")
        history = messages + [choice.message.model_dump(exclude_none=True),
                              {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        final = client.chat.completions.create(model=graph.stem, messages=history,
                                               tools=[WEATHER, TIME], tool_choice="none",
                                               max_tokens=8, temperature=0)
        assert final.choices[0].finish_reason in ("stop", "length")
        assert final.choices[0].message.tool_calls is None
        seen = [*messages, {"role": "assistant", "content": "", "tool_calls": [{
            "id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        want = tok.apply_chat_template(seen, add_generation_prompt=True, tools=[WEATHER, TIME])
        assert final.usage.prompt_tokens == len(want)  # the template saw the call and answer
        # a named function, streamed: the call comes whole in one chunk
        chunks = list(client.chat.completions.create(
            model=graph.stem, messages=messages, tools=[WEATHER, TIME], seed=1, stream=True,
            tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=120))
        calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
        assert [c.function.name for c in calls] == ["get_time"]
        assert json.loads(calls[0].function.arguments)["zone"] in ("UTC", "CET")
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("body, param, words", [
    ({"tool_choice": "auto"}, "tool_choice", "needs 'tools'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "tool_choice", "no tool is named 'x'"),
    ({"tools": [{"type": "function", "function": {"name": "a", "strict": True}}]}, "tools",
     "strict"),
    ({"tools": [WEATHER], "logprobs": True}, "logprobs", "not supported"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "unique"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools", "'type': 'function'"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {
        "type": "json_object"}}, "tool_choice", "cannot be combined"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "tool_call_id"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                    "function": {"name": "f", "arguments": "{oops"}}]}]}, "messages",
     "JSON object"),
])
def test_bad_tool_requests_are_400_naming_the_field(hermes, body, param, words):
    r = httpx.post(f"{hermes.base}/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"]


def test_the_openai_client_sees_a_400(hermes):
    with pytest.raises(openai.BadRequestError):
        hermes.client().chat.completions.create(
            model="hermes", messages=[{"role": "user", "content": "x"}], tool_choice="auto")
