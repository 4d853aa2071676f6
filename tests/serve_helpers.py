"""`mlxgraph serve` in a subprocess on a free port, and the chat graph the serve tests use.

``running_server(graph, *flags)`` starts the server (``--port 0``), reads the port it
prints, drains its log into a list, and on exit stops it with SIGTERM and checks it exits 0
(graceful shutdown); a server that does not stop is killed and the test fails.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from tool_helpers import synthetic_graph

SPECIALS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Once upon a time there was a tiny model that liked to chat with everyone it met.",
    "Hello! How are you today? I am fine, thank you. What a lovely day for a walk.",
    "The server answers many clients at once, each with its own session.",
]


def chat_graph(path, template=TEMPLATE, **shape):
    """A synthetic Llama graph carrying a trained byte-level BPE tokenizer with a chat
    template (vocabulary = the tokenizer's, so every id decodes). No torch. ``shape``: more
    of synthetic_graphs.llama's arguments (heads=1, kv_heads=1: a head dim of 64)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, show_progress=False, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    config = {"bos_token": "<s>", "eos_token": "<|im_end|>", "chat_template": template}
    files = {"tokenizer.json": tok.to_str(), "tokenizer_config.json": json.dumps(config)}
    return synthetic_graph(path, eos=(tok.token_to_id("<|im_end|>"),), tokenizer="embedded",
                           vocab=tok.get_vocab_size(), files=files, **shape)


class Server:
    """A running server: ``url`` (http://127.0.0.1:PORT), ``base`` (its /v1), ``log`` lines."""

    def __init__(self, proc, port):
        self.proc, self.port = proc, port
        self.url = f"http://127.0.0.1:{port}"
        self.base = f"{self.url}/v1"
        self.log = []

    def client(self, **kw):
        """An ``openai.OpenAI`` client for this server."""
        import openai

        return openai.OpenAI(base_url=self.base, api_key="unused", max_retries=0, **kw)

    def stop(self, sig=signal.SIGTERM, timeout=30) -> int:
        """Send ``sig`` and wait; returns the exit code (kills it after ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("the server did not stop within the timeout") from None
        return self.proc.returncode


def start_server(graph, *flags) -> Server:
    """Start ``mlxgraph serve GRAPH --port 0 FLAGS`` and wait until it listens."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "mlxgraph", "serve", str(graph), "--port", "0",
                             *map(str, flags)], stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    deadline = time.monotonic() + 60
    port = None
    while port is None:
        line = proc.stderr.readline()
        if not line:
            proc.wait()
            raise AssertionError(f"serve exited {proc.returncode}:\n{''.join(lines)}")
        lines.append(line)
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        port = int(m.group(1)) if m else None
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("serve did not start")
    server = Server(proc, port)
    server.log.extend(lines)
    threading.Thread(target=_drain, args=(proc.stderr, server.log), daemon=True).start()
    return server


def _drain(stream, lines) -> None:
    for line in iter(stream.readline, ""):
        lines.append(line)


@contextlib.contextmanager
def running_server(graph, *flags):
    """A started server, stopped with SIGTERM at the end (its exit code must be 0)."""
    server = start_server(graph, *flags)
    try:
        yield server
    finally:
        code = server.stop()
    assert code == 0, "".join(server.log)[-3000:]
