"""The server's memory is what it keeps: finished requests (done, failed or cancelled) leave
no reference cycle holding their sessions or MLX arrays, so with the cycle collector off a
stream of requests keeps MLX's active memory within the prefix cache plus a fixed
overhead (the scheduler in this process, no HTTP)."""

import gc
import threading
import time

import mlx.core as mx
import pytest
from serve_helpers import chat_graph

from mlxgraph.generation.options import SamplingOptions, SessionOptions
from mlxgraph.tools.serve.job import Job
from mlxgraph.tools.serve.options import ServeOptions
from mlxgraph.tools.serve.scheduler import Scheduler
from mlxgraph.tools.text_options import GraphSource

CACHE = 256 << 10  # --cache-memory of this scheduler, in bytes


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    graph = chat_graph(tmp_path_factory.mktemp("serve-memory") / "chat.mlxg")
    s = Scheduler(ServeOptions(GraphSource(str(graph)), SessionOptions(prefill_chunk=8),
                               cache_bytes=CACHE))
    s.start()
    yield s
    s.close()


def _unchecked(**settings) -> SamplingOptions:
    """SamplingOptions made without its check, so a bad setting reaches the scheduler (no
    caller can send one; the Sampler's own check refuses it at admission)."""
    options = object.__new__(SamplingOptions)
    for name, value in {**vars(SamplingOptions()), **settings}.items():
        object.__setattr__(options, name, value)
    return options


def _run(scheduler, prompts, **kind):
    """Submit one job per prompt and wait until each has ended; returns the jobs."""
    tok, done, jobs = scheduler.info.tokenizer, threading.Semaphore(0), []
    for i, prompt in enumerate(prompts):
        sampling = _unchecked(temperature=kind.get("temperature", 0.0), seed=i)
        job = Job(tok.encode(prompt), kind.get("max_tokens", 6), sampling, kind.get("stop", ()),
                  scheduler.info.stop_ids, kind.get("logprobs"))
        job.post = lambda e: e[0] in ("done", "error") and done.release()
        scheduler.submit([job])
        if kind.get("cancel"):
            scheduler.cancel(job)
        jobs.append(job)
    for _ in jobs if not kind.get("cancel") else ():  # a cancelled job posts nothing
        assert done.acquire(timeout=60)
    deadline = time.monotonic() + 10
    while scheduler.stats()["active"] or scheduler.stats()["waiting"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return jobs


def _mixed(scheduler, n):
    prompts = [f"Once upon a time {i} there was" for i in range(n)]
    _run(scheduler, prompts)
    _run(scheduler, prompts[: n // 2], logprobs=3, temperature=0.8)
    _run(scheduler, prompts[: n // 2], stop=("e",))
    _run(scheduler, prompts[: n // 4], temperature=-1.0)  # a bad setting: fails at admission
    _run(scheduler, prompts[: n // 4], cancel=True)


def test_finished_requests_leave_no_cycles_and_memory_stays_flat(scheduler):
    _mixed(scheduler, 8)  # warm up: the kept sessions and the kernels' first shapes
    gc.collect()
    gc.disable()
    try:
        before = mx.get_active_memory()
        for _ in range(4):
            _mixed(scheduler, 8)
        grown = mx.get_active_memory() - before
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage
                if isinstance(o, mx.array) or type(o).__name__ in ("Session", "Job")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not left, f"reference cycles hold {len(left)} objects: {sorted(set(left))}"
    assert grown <= CACHE + (1 << 20), grown  # the prefix cache, plus a MiB
    stats = scheduler.stats()
    assert stats["failed"] >= 10 and stats["cancelled"] >= 2 and stats["kept_bytes"] <= CACHE
