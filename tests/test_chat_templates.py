"""--chat-template NAME|FILE (issue 32, item 5): base models and graphs without a template
chat with a built-in (chatml, plain) or a jinja2 file, in generate, chat and serve."""

import json
import os
import subprocess
import sys

import httpx
import pytest
from serve_helpers import chat_graph, running_server

import mlxgraph
from mlxgraph.generation.chat_templates import BUILTIN, TemplatedTokenizer, chat_template
from mlxgraph.tools.text_options import GraphSource, template_stops

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
CONVERSATION = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hello there"},
                {"role": "assistant", "content": " Hi."},
                {"role": "user", "content": "How are you?"}]


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A graph whose tokenizer has no chat template."""
    return chat_graph(tmp_path_factory.mktemp("no-template") / "bare.mlxg", template=None)


def _cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "mlxgraph", *map(str, args)], input=stdin,
                          capture_output=True, text=True, env=ENV, timeout=120)


@pytest.mark.parametrize("name, text", [
    ("plain", "Be brief.\n\nUser: Hello there\nAssistant: Hi.\nUser: How are you?\nAssistant:"),
    ("chatml", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there"
               "<|im_end|>\n<|im_start|>assistant\n Hi.<|im_end|>\n<|im_start|>user\nHow are "
               "you?<|im_end|>\n<|im_start|>assistant\n"),
])
def test_built_ins_render_the_conversation(bare, name, text):
    tok = mlxgraph.load(bare).tokenizer
    assert tok.chat_template is None
    templated = TemplatedTokenizer(tok, BUILTIN[name])
    assert templated.apply_chat_template(CONVERSATION) == tok.encode(text,
                                                                     add_special_tokens=False)
    assert templated.decode(tok.encode("abc", add_special_tokens=False)) == "abc"  # its own


def test_chat_refuses_a_graph_without_a_template_and_says_what_to_do(bare):
    done = _cli("chat", bare, stdin="hello\n")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--chat-template" in lines[0], lines


def test_chat_with_the_plain_template(bare):
    done = _cli("chat", bare, "--chat-template", "plain", "--max-tokens", 4,
                stdin="Hello there\nHow are you?\n")
    assert done.returncode == 0, done.stderr
    stats = [line for line in done.stderr.splitlines() if line.startswith("[prefilled")]
    assert len(stats) == 2, done.stderr
    assert "from the session" in stats[1] and "(0 from the session)" not in stats[1]


def test_generate_renders_a_template_file(bare, tmp_path):
    template = tmp_path / "upper.jinja"
    template.write_text("{{ messages[-1]['content'] | upper }}")
    done = _cli("generate", bare, "--prompt", "once upon", "--chat-template", template,
                "--max-tokens", 1, "--json")
    assert done.returncode == 0, done.stderr
    tok = mlxgraph.load(bare).tokenizer
    assert json.loads(done.stdout)["prompt_ids"] == tok.encode("ONCE UPON",
                                                               add_special_tokens=False)


@pytest.mark.parametrize("flags, message", [
    (["--chat-template", "nope"], "neither a built-in chat template (chatml, plain) nor a file"),
    (["--chat-template", "plain", "--ignore-chat-template"], "contradict"),
])
def test_generate_refuses_in_one_line(bare, flags, message):
    done = _cli("generate", bare, "--prompt", "x", *flags)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and message in lines[0], lines


def test_a_built_in_brings_its_stop_strings(bare, tmp_path):
    assert template_stops(GraphSource(str(bare), chat_template="plain")) == ["\nUser:"]
    assert template_stops(GraphSource(str(bare))) == []
    (tmp_path / "t.jinja").write_text("{{ messages[0]['content'] }}")
    assert chat_template(str(tmp_path / "t.jinja")).stops == ()


def test_serve_chats_with_the_chosen_template(bare):
    tok = mlxgraph.load(bare).tokenizer
    messages = [{"role": "user", "content": "Hello there"}]
    expected = TemplatedTokenizer(tok, BUILTIN["chatml"]).apply_chat_template(messages)
    with running_server(bare, "--chat-template", "chatml") as server:
        reply = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "model": "bare", "messages": messages, "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == len(expected)
