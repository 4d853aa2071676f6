"""`mlxgraph serve`'s features under load (serve_bench.py --features): a JSON schema's
constrained decoding against the same requests unconstrained, and ``n=4`` in one request
against four separate requests of the same prompt.

The model needs a tokenizer that can spell JSON, so this runs on the `small` Llama with a
byte-level BPE tokenizer trained on this repository's own text, padded with special tokens
to the model's vocabulary (``add_bpe_tokenizer``). Each figure is non-streaming requests
sent by ``clients`` threads for ``seconds``: completion tokens per second over the run, and
the prompt tokens the server computed (its /stats: admitted less reused) per request.
"""

import json
import random
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}


def add_bpe_tokenizer(folder: Path, vocab: int) -> None:
    """A byte-level BPE tokenizer.json of exactly ``vocab`` ids (trained on the repository's
    docs and Python; special padding tokens fill the rest; EOS </s> = 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [p.read_text() for pattern in ("docs/*.md", "**/*.py") for p in ROOT.glob(pattern)
             if ".venv" not in p.parts and "out" not in p.parts]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([f"<pad{i}>" for i in range(vocab - tok.get_vocab_size())])
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": "</s>", "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def _load(url, clients, seconds, body_of) -> dict:
    """``clients`` threads posting body_of(rng) until ``seconds`` pass; the figures."""
    done, errors = [], []
    before = httpx.get(f"{url}/stats").json()
    deadline = time.perf_counter() + seconds

    def loop(i):
        rng = random.Random(i)
        with httpx.Client(timeout=600) as client:
            while time.perf_counter() < deadline:
                r = client.post(f"{url}/v1/completions", json=body_of(rng))
                if r.status_code != 200:
                    errors.append(r.text[:200])
                    return
                doc = r.json()
                done.append((doc["usage"]["completion_tokens"], [
                    c["text"] for c in doc["choices"]], [c["finish_reason"] for c in
                                                         doc["choices"]]))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = httpx.get(f"{url}/stats").json()
    tokens = sum(d[0] for d in done)
    return {"requests": len(done), "tokens": tokens, "tok_per_s": tokens / wall,
            "prefilled_per_request": (_prefilled(after) - _prefilled(before)) / max(
                1, len(done)), "errors": errors[:3],
            "answers": [t for d in done for t in d[1]],
            "finishes": [f for d in done for f in d[2]]}


def _prefilled(stats) -> int:
    """Prompt tokens the server computed (admitted, less those kept sessions supplied)."""
    return stats.get("prompt_tokens", 0) - stats.get("reused_tokens", 0)


def run_features(url, clients, seconds, max_tokens, prompt) -> dict:
    """The two comparisons; the schema's answers are checked to parse."""
    plain = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0}
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    for extra in ({}, {"response_format": fmt}):  # warm-up: compiled kernels, the grammar
        httpx.post(f"{url}/v1/completions", json={**plain, **extra}, timeout=600)
    doc = {
        "unconstrained": _load(url, clients, seconds, lambda r: {
            **plain, "seed": r.randrange(1 << 30)}),
        "json_schema": _load(url, clients, seconds, lambda r: {
            **plain, "seed": r.randrange(1 << 30), "response_format": fmt}),
        "four_requests": _load(url, 4, seconds, lambda r: {
            **plain, "seed": r.randrange(1 << 30), "ignore_eos": True}),
        "one_request_n4": _load(url, 1, seconds, lambda r: {
            **plain, "seed": r.randrange(1 << 30), "ignore_eos": True, "n": 4}),
    }
    stopped = [json.loads(a) for a, f in zip(doc["json_schema"]["answers"],
                                            doc["json_schema"]["finishes"]) if f == "stop"]
    doc["json_schema"]["parsed"] = len(stopped)
    for run in doc.values():
        run.pop("answers")
        run.pop("finishes")
    return doc


def print_features(doc) -> None:
    """The features table."""
    print(f"{'run':<15} {'reqs':>5} {'tokens':>7} {'tok/s':>8} {'prefilled/req':>14}")
    for name, r in doc.items():
        print(f"{name:<15} {r['requests']:>5} {r['tokens']:>7} {r['tok_per_s']:>8.1f} "
              f"{r['prefilled_per_request']:>14.1f}" + (f"  errors: {r['errors']}"
                                                        if r["errors"] else ""))
    j = doc["json_schema"]
    print(f"json_schema answers that ended by the grammar and parse: {j['parsed']}")


__all__ = ["SCHEMA", "add_bpe_tokenizer", "print_features", "run_features"]
