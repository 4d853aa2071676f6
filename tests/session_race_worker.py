"""Two threads racing on one session, in its own process (a crash is a signal, not a test).

    python tests/session_race_worker.py FOLDER SECONDS

Phase 1 (the tiny graph and its float64 oracle): both threads step the same session with
random tokens, evaluating their outputs at once, later (after another call), or only by
``mx.async_eval``, and fork, save, describe and check it in between; the history only
grows, so the successful steps, ordered by position, are the session's whole history,
and every evaluated output is compared with the oracle fed that history.
Phase 2 (a Llama with larger products): the same race with trim, reset, step_batch with
a fork, and restores from the saved file; only no crash and SessionError-only count.
Prints one JSON line: the calls that succeeded and the refusals by message.
"""

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import mlxgraph  # noqa: E402

mlxgraph.preload_blas()
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from synthetic_graphs import llama  # noqa: E402
from tiny_graph import VOCAB, TinyOracle, build_tiny_graph  # noqa: E402

from mlxgraph import SessionError  # noqa: E402

CAPACITY = 4096


def _race(seconds, work):
    refused, errors = {}, []
    stop = time.monotonic() + seconds

    def run(k):
        rng = np.random.default_rng(k)
        try:
            while time.monotonic() < stop:
                try:
                    work(k, rng)
                except SessionError as e:
                    key = str(e).split(": ", 1)[-1][:50]
                    refused[key] = refused.get(key, 0) + 1
        except BaseException as e:  # noqa: BLE001 - reported, the test fails on it
            errors.append(f"thread {k}: {type(e).__name__}: {e}"[:400])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return refused, errors


def phase1(folder: Path, seconds: float) -> dict:
    wts = build_tiny_graph(folder / "tiny.mlxg", max_t=8)
    program = mlxgraph.load(folder / "tiny.mlxg")
    session = program.session(capacity=CAPACITY, max_step=4)
    done, calls = [], [0]   # (start, tokens, logits or lazy outputs)

    def work(k, rng):
        op = rng.integers(0, 10)
        if op < 6:
            if session.length > CAPACITY - 64:
                return
            toks = rng.integers(0, VOCAB, int(rng.integers(1, 4)))
            start = session.length
            out = session.step(mx.array(toks[None].astype(np.int32)),
                               range(start, start + len(toks)))
            if op < 2:
                out = np.array(out)
            elif op < 4:
                mx.async_eval(out)
            done.append((start, toks, out))
            if op >= 4:   # evaluated later, after another call of this thread
                index = len(done) - 1
                try:
                    work(k, rng)
                finally:
                    done[index] = (start, toks, np.array(out))
        elif op == 6:
            twin = session.fork()
            mx.eval(twin.cache_state())
        elif op == 7:
            session.save(folder / f"race{k}.safetensors")
        elif op == 8:
            session.describe()
        else:
            session.check()
        calls[0] += 1

    refused, errors = _race(seconds, work)
    steps = sorted(done, key=lambda d: d[0])
    at, oracle, checked = 0, TinyOracle(wts), 0
    for start, toks, out in steps:
        if start != at:
            errors.append(f"history has a gap or overlap at {start} (expected {at})")
            break
        want = oracle.step(toks)
        at += len(toks)
        if isinstance(out, np.ndarray):
            got = out.reshape(want.shape)
            if not np.abs(got - want).max() <= 2e-4 * max(1.0, np.abs(want).max()):
                errors.append(f"step at {start}: logits differ from the oracle")
            checked += 1
    if at != session.length:
        errors.append(f"the steps hold {at} positions, the session {session.length}")
    return {"calls": calls[0], "steps": len(steps), "compared": checked, "refused": refused,
            "errors": errors}


def phase2(folder: Path, seconds: float) -> dict:
    llama(layers=2, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=256,
          max_context=512).write(folder / "llama.mlxg")
    program = mlxgraph.load(folder / "llama.mlxg")
    session = program.session(capacity=512, max_step=8)
    calls = [0]

    def work(k, rng):
        op = rng.integers(0, 9)
        if op < 4:
            if session.length > 400:
                session.reset()
            toks = rng.integers(0, 256, (1, int(rng.integers(1, 9)))).astype(np.int32)
            out = session.step(mx.array(toks), range(session.length,
                                                      session.length + toks.shape[1]))
            if op < 2:
                mx.eval(out)
        elif op == 4:
            session.trim(min(session.length, int(rng.integers(0, 3))))
        elif op == 5:
            twin = session.fork()
            outs = program.step_batch([(session, [[1]], [session.length]),
                                       (twin, [[2]], [twin.length])])
            mx.eval(outs)
        elif op == 6:
            session.save(folder / f"race2-{k}.safetensors")
            mx.eval(program.restore(folder / f"race2-{k}.safetensors").cache_state())
        elif op == 7:
            session.reset()
        else:
            mx.eval(session.fork().step([[3]], [session.length]))
        calls[0] += 1

    refused, errors = _race(seconds, work)
    return {"calls": calls[0], "refused": refused, "errors": errors}


if __name__ == "__main__":
    folder, seconds = Path(sys.argv[1]), float(sys.argv[2])
    print(json.dumps({"phase1": phase1(folder, seconds / 2),
                      "phase2": phase2(folder, seconds / 2)}))
