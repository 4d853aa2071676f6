"""Streaming load against an OpenAI-compatible server: N clients, each sending streaming
completions one after another for a bounded time (serve_bench.py).

Per request: time to first token (request sent .. first chunk carrying text), the gaps
between chunks carrying text (inter-token latency), and the completion tokens (the usage
chunk's count, else the chunks carrying text). Each client is a thread with its own HTTP
connection; prompts are random words (a fresh prompt per request, so no server reuses a
prefix and both do the same work).
"""

import json
import random
import socket
import threading
import time

import httpx


def words_prompt(n: int, vocab: int, rng: random.Random) -> str:
    """n random words of the benchmark's word-level tokenizer (one token each)."""
    return " ".join(f"w{rng.randrange(3, vocab)}" for _ in range(n))


def stream_once(client, url, prompt, max_tokens) -> dict:
    """One streaming completion; returns its timings and token count."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    arrivals, text, usage = [], [], None
    with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            doc = json.loads(line[6:])
            if doc.get("usage"):
                usage = doc["usage"]
            for choice in doc.get("choices") or ():
                if choice.get("text"):
                    arrivals.append(time.perf_counter())
                    text.append(choice["text"])
    tokens = usage["completion_tokens"] if usage else len(arrivals)
    return {"start": t0, "end": time.perf_counter(), "ttft": arrivals[0] - t0 if arrivals
            else None, "gaps": [b - a for a, b in zip(arrivals, arrivals[1:])],
            "tokens": tokens, "text": "".join(text)}


def run_load(url, clients, seconds, prompt_tokens, max_tokens, vocab, seed=0) -> dict:
    """``clients`` threads sending requests until ``seconds`` have passed (requests in
    flight then finish); returns the figures."""
    results, errors = [], []
    deadline = time.perf_counter() + seconds
    barrier = threading.Barrier(clients)
    transport_options = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]

    def client_loop(i):
        rng = random.Random(seed * 1000 + i)
        transport = httpx.HTTPTransport(socket_options=transport_options)
        with httpx.Client(transport=transport, timeout=600) as client:
            barrier.wait()
            while time.perf_counter() < deadline:
                try:
                    results.append(stream_once(client, url, words_prompt(
                        prompt_tokens, vocab, rng), max_tokens))
                except Exception as e:  # noqa: BLE001 - reported, not raised
                    errors.append(f"{type(e).__name__}: {e}")
                    return

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summarise(results, errors)


def _percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def summarise(results, errors) -> dict:
    """Aggregate tok/s over the whole run, TTFT and inter-token latency p50/p99 (ms)."""
    if not results:
        return {"requests": 0, "errors": errors[:3]}
    start = min(r["start"] for r in results)
    end = max(r["end"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["ttft"] * 1e3 for r in results if r["ttft"] is not None]
    gaps = [g * 1e3 for r in results for g in r["gaps"]]
    return {
        "requests": len(results),
        "tokens": tokens,
        "seconds": end - start,
        "tok_per_s": tokens / (end - start),
        "ttft_ms_p50": _percentile(ttft, 50),
        "ttft_ms_p99": _percentile(ttft, 99),
        "itl_ms_p50": _percentile(gaps, 50),
        "itl_ms_p99": _percentile(gaps, 99),
        "errors": errors[:3],
    }


__all__ = ["run_load", "stream_once", "summarise", "words_prompt"]
