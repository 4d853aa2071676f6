"""chat's and serve's --kv-bits and --window take effect: the sessions they make are
quantized or windowed as asked (and as generate's with the same flags), and a setting the
graph cannot honour is a clear exit 2 before anything runs.

Oracles: a solo ``mlxgraph.generate`` or ``ChatSession`` on a session made with the same
SessionOptions, the float cache's bytes, and the session's own refusal (a head dim that is
not a multiple of the quantization group).
"""

import argparse
import os
import subprocess
import sys
import threading

import pytest
from serve_helpers import chat_graph, running_server

import mlxgraph
from mlxgraph.generation.options import SamplingOptions, SessionOptions
from mlxgraph.tools import serve_cmd

PY = sys.executable
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
NARROW = "head_dim 16 is not a multiple of the quantization group size 64"


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """{"wide": head dim 64 (quantizable), "narrow": head dim 16}: chat graphs."""
    folder = tmp_path_factory.mktemp("session-flags")
    return {"wide": chat_graph(folder / "wide.mlxg", heads=1, kv_heads=1),
            "narrow": chat_graph(folder / "narrow.mlxg")}


def _mlxgraph(*argv, stdin=""):
    return subprocess.run([PY, "-m", "mlxgraph", *map(str, argv)], input=stdin,
                          capture_output=True, text=True, timeout=120, env=ENV)


def test_chat_answers_from_a_quantized_session(graphs):
    proc = _mlxgraph("chat", graphs["wide"], "--kv-bits", 8, "--max-tokens", 8, stdin="Hello\n")
    assert proc.returncode == 0, proc.stderr
    program = mlxgraph.load(graphs["wide"])
    session = SessionOptions(kv_bits=8).open(program)
    assert session.policy["kv_bits"] == 8
    chat = mlxgraph.ChatSession(program, program.tokenizer, session, max_tokens=8)
    assert proc.stdout == chat.send("Hello") + "\n"


def test_chat_says_its_window_and_refuses_what_the_graph_cannot_take(graphs):
    proc = _mlxgraph("chat", graphs["wide"], "--window", 4, "--max-tokens", 4, stdin="Hi\n")
    assert proc.returncode == 0, proc.stderr
    assert "approximation: full-attention layers 0,1 keep only the last 4 tokens" in proc.stderr
    proc = _mlxgraph("chat", graphs["narrow"], "--kv-bits", 8, stdin="Hi\n")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("mlxgraph: chat: ") and NARROW in proc.stderr


def _serve_one(graph, ids, *flags):
    """(the tokens, the kept session's bytes) of one greedy request through a Scheduler
    built from `serve GRAPH FLAGS` (in this process, no HTTP)."""
    from mlxgraph.tools.serve.job import Job
    from mlxgraph.tools.serve.scheduler import Scheduler

    p = argparse.ArgumentParser()
    serve_cmd.add_arguments(p)
    scheduler = Scheduler(serve_cmd.serve_options(p.parse_args([str(graph), *map(str, flags)])))
    scheduler.start()
    try:
        done = threading.Event()
        job = Job(ids, 6, SamplingOptions())
        job.post = lambda event: event[0] in ("done", "error") and done.set()
        scheduler.submit([job])
        assert done.wait(60)
        tokens = list(job.tokens)
        return tokens, scheduler.stats()["kept_bytes"]
    finally:
        scheduler.close()


def test_serve_kv_bits_quantizes_every_request_session(graphs):
    program = mlxgraph.load(graphs["wide"])
    ids = program.tokenizer.encode("Once upon a time there was a tiny model")
    floats, float_bytes = _serve_one(graphs["wide"], ids, "--prefill-chunk", 8)
    tokens, quantized_bytes = _serve_one(graphs["wide"], ids, "--prefill-chunk", 8,
                                         "--kv-bits", 8)
    # 8-bit codes plus a float32 scale and bias per 64 elements, against 4 bytes an element.
    assert 0 < quantized_bytes <= float_bytes * 1.2 / 4, (quantized_bytes, float_bytes)
    options = SessionOptions(prefill_chunk=8, kv_bits=8)
    solo = mlxgraph.generate(program, ids, max_tokens=6, ignore_eos=True, prefill_chunk=8,
                             session=options.open(program))
    assert tokens == solo.token_ids and len(floats) == 6


def test_serve_says_its_window_and_refuses_what_the_graph_cannot_take(graphs):
    with running_server(graphs["wide"], "--window", 4, "--max-tokens", 8) as server:
        r = server.client().completions.create(model="wide", prompt="Once upon a time",
                                               max_tokens=4, temperature=0)
        assert r.usage.completion_tokens >= 1
    assert any("approximation: full-attention layers 0,1 keep only the last 4 tokens" in line
               for line in server.log), server.log
    proc = _mlxgraph("serve", graphs["narrow"], "--kv-bits", 8, "--port", 0)
    assert proc.returncode == 2 and NARROW in proc.stderr, proc.stderr
