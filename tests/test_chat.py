"""Text in, text out on a real Hugging Face folder: chat template, BOS, EOS list, the embedded
tokenizer, stop strings, and chat sessions; transformers is the oracle.

The folder (tests/chat_folder.py, built and exported once per module) has a tokenizer
trained here, a chat template and a generation_config whose EOS list holds a token the
greedy decoding reaches: transformers stops there, and so must mlxgraph.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from tool_helpers import run_cli

import mlxgraph
from mlxgraph.generation.chat_session import ChatSession

PY = sys.executable
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """(folder, graph, references) of the exported chat folder."""
    import chat_folder

    root = tmp_path_factory.mktemp("chat")
    folder, graph = root / "hf-chat", root / "chat.mlxg"
    return folder, graph, chat_folder.build(folder, graph)


def _generate(graph, *args, cwd=None):
    proc = subprocess.run(
        [PY, "-m", "mlxgraph", "generate", str(graph), *map(str, args), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_generate_matches_transformers_until_the_generation_config_eos(chat_model):
    _, graph, refs = chat_model
    stopped = 0
    for text, ref in refs["prompts"].items():
        doc = _generate(graph, "--prompt", text, "--max-tokens", len(ref["free_ids"]))
        assert doc["prompt_ids"] == ref["prompt_ids"]  # template applied, one BOS
        assert doc["token_ids"] == ref["greedy_ids"]
        if ref["greedy_ids"][-1] in refs["eos"]:
            assert doc["stop_reason"] == "eos" and len(doc["token_ids"]) < len(ref["free_ids"])
            stopped += 1
    assert stopped >= 1  # the EOS that only generation_config.json lists stopped one


def test_the_file_alone_generates_elsewhere(chat_model, tmp_path):
    folder, graph, refs = chat_model
    assert str(folder.parent).encode() not in graph.read_bytes()  # no path of the exporting machine
    alone = tmp_path / "elsewhere"
    alone.mkdir()
    shutil.copy(graph, alone / "model.mlxg")
    ref = refs["prompts"]["Hello"]
    doc = _generate("model.mlxg", "--prompt", "Hello", "--max-tokens", 24, cwd=alone)
    assert doc["prompt_ids"] == ref["prompt_ids"] and doc["token_ids"] == ref["greedy_ids"]
    proc = subprocess.run(
        [PY, "-m", "mlxgraph", "inspect", str(graph), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    meta = json.loads(proc.stdout)["metadata"]
    assert meta["tokenizer"] == "embedded" and meta["eos_token_ids"] == refs["eos"]
    assert set(meta["tokenizer_files"]) == {
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    }
    assert meta["max_context"] == 256  # --max-seq-len defaults to the model's 256 positions
    assert meta["extra"]["source"] == folder.name


def test_max_seq_len_past_the_model_names_the_flag(chat_model, tmp_path, capsys):
    folder, _, _ = chat_model
    code, _, err = run_cli(
        capsys, "export", folder, "-o", tmp_path / "x.mlxg", "--max-seq-len", 4096
    )
    assert code == 2 and "--max-seq-len 4096 exceeds" in err and "<= 256" in err


def test_bos_and_plain_prompts_as_transformers(chat_model):
    _, graph, refs = chat_model
    doc = _generate(graph, "--prompt", "Hello", "--ignore-chat-template", "--max-tokens", 1)
    assert doc["prompt_ids"] == refs["plain_ids"]


def test_stop_string_and_extra_eos(chat_model):
    _, graph, refs = chat_model
    program = mlxgraph.load(graph)
    ref = refs["prompts"]["Tell me a story about a tiny model."]
    full = program.tokenizer.decode(ref["free_ids"])
    stop = full[6:9]
    assert stop and full.find(stop) > 0
    doc = _generate(
        graph, "--prompt", "Tell me a story about a tiny model.", "--max-tokens", 24, "--stop", stop
    )
    assert doc["stop_reason"] == "stop_string" and doc["text"] == full[: full.find(stop)]
    assert doc["token_ids"] == ref["free_ids"][: len(doc["token_ids"])]
    # In Python, on a kept session: it holds the prompt and every token but the last.
    session = program.session()
    result = mlxgraph.generate(
        program, "Tell me a story about a tiny model.", max_tokens=24, stop=[stop], session=session
    )
    assert result.stop_reason == "stop_string" and result.token_ids == doc["token_ids"]
    assert session.length == len(result.prompt_ids) + len(result.token_ids) - 1
    target = ref["free_ids"][4]
    token = program.tokenizer._tok.id_to_token(target)
    doc = _generate(
        graph,
        "--prompt",
        "Tell me a story about a tiny model.",
        "--max-tokens",
        24,
        "--extra-eos-token",
        token,
    )
    assert doc["token_ids"] == ref["free_ids"][: ref["free_ids"].index(target) + 1]
    assert doc["stop_reason"] == "eos"


def test_python_api_generate_and_stream(chat_model):
    _, graph, refs = chat_model
    program = mlxgraph.load(graph)
    ref = refs["prompts"]["Hello"]
    result = mlxgraph.generate(program, "Hello", max_tokens=24)
    assert result.prompt_ids == ref["prompt_ids"] and result.token_ids == ref["greedy_ids"]
    assert result.stop_reason == "eos" and result.text == program.tokenizer.decode(
        ref["greedy_ids"]
    )
    pieces = list(mlxgraph.stream_generate(program, "Hello", max_tokens=24))
    assert "".join(p.text for p in pieces) == result.text and pieces[-1].stop_reason == "eos"


def test_chat_keeps_one_session(chat_model):
    _, graph, refs = chat_model
    program = mlxgraph.load(graph)
    chat = ChatSession(
        program, program.tokenizer, program.session(), system_prompt="Be brief.", max_tokens=12
    )
    previous = 0
    for text, want in zip(("Hello", "Tell me a story.", "Thank you!"), refs["chat"], strict=True):
        responses = list(chat.stream(text))
        stats = responses[-1].stats
        ids = want["ids"]  # transformers: the full history's template
        assert chat.held[: len(ids)] == ids  # what the session holds, in order
        assert [r.token for r in responses if r.token is not None] == want["answer_ids"]
        assert chat.messages[-1]["content"] == want["text"]
        assert stats.cached_tokens + stats.prompt_tokens == len(ids)
        assert stats.cached_tokens >= previous  # the whole previous prompt was kept
        assert stats.prompt_tokens < len(ids) or previous == 0
        previous = len(ids)
    # Regenerate: trimmed to before the answer, one token fed, the same greedy answer.
    again = list(chat.stream_regenerate())
    assert (
        again[-1].stats.prompt_tokens == 1
        and "".join(r.text for r in again) == refs["chat"][-1]["text"]
    )
    chat.reset()
    assert list(chat.stream("Hello"))[-1].stats.cached_tokens == 0
    # send() returns the answer itself, the same text as the stream gave
    chat.reset()
    assert chat.send("Hello") == refs["chat"][0]["text"]
    assert chat.regenerate() == refs["chat"][0]["text"]


def test_one_answer_at_a_time(chat_model):
    """Two turns before the first is read used to interleave the history: now the second
    call is refused while the first streams, and an unread stream changes nothing."""
    _, graph, refs = chat_model
    program = mlxgraph.load(graph)
    chat = ChatSession(program, program.tokenizer, program.session(),
                       system_prompt="Be brief.", max_tokens=12)
    unread = chat.stream("Never read")
    assert chat.messages == [{"role": "system", "content": "Be brief."}]
    unread.close()
    first = chat.stream("Hello")
    next(first)
    for call in (lambda: chat.send("Tell me a story."), lambda: chat.stream("x"),
                 chat.reset, chat.regenerate):
        with pytest.raises(mlxgraph.ChatBusyError, match="still streaming"):
            call()
    list(first)
    assert len(chat.messages) == 3 and chat.messages[-1]["role"] == "assistant"
    assert chat.send("Tell me a story.") == refs["chat"][1]["text"]
    # a stream abandoned half way (closed) frees the chat; its partial answer is kept
    partial = chat.stream("Thank you!")
    next(partial)
    partial.close()
    assert chat.messages[-2]["content"] == "Thank you!" and len(chat.messages) == 7
    chat.reset()


def test_chat_command_reports_what_it_prefilled(chat_model):
    _, graph, _ = chat_model
    proc = subprocess.run(
        [PY, "-m", "mlxgraph", "chat", str(graph), "--max-tokens", "8"],
        input="Hello\nTell me more.\n/regenerate\n/reset\nHi\n",
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stderr
    counts = [
        (int(a), int(b))
        for a, b in re.findall(
            r"prefilled (\d+) new tokens \((\d+) from the session\)", proc.stderr
        )
    ]
    assert len(counts) == 4, proc.stderr
    assert counts[0][1] == 0 and counts[1][1] > 0 and counts[2][0] == 1 and counts[3][1] == 0
