"""Benchmark process: decode for B sequences at once, mlxgraph (batched and one after
another) or mlx-lm's BatchGenerator, on the same weights.

    python benchmarks/engines/batch_engine.py --engine mlxgraph|mlx-lm --model PATH \\
        --batches 1,2,4 --prompt-tokens 64 --new-tokens 32

Each sequence has its own 64-token prompt (seeded, distinct rows); all are prefilled, then
``--new-tokens`` greedy decode steps are timed. mlxgraph: ``program.step_batch`` over all
rows per step ("batched"), and the same sessions stepped one after another, each step
evaluated ("sequential"). mlx-lm: ``BatchGenerator`` with completion and prefill batch
sizes B (as ``mlx_lm.server`` batches), timed from the first generated token of every row
to the last. Prints one ``RESULT {json}`` line.
"""

import argparse
import json
import random
import sys
import time


def _prompts(b, n, vocab):
    rng = random.Random(1234)
    return [[rng.randrange(3, vocab) for _ in range(n)] for _ in range(b)]


def _mlxgraph(args):
    import mlxgraph

    program = mlxgraph.load(args.model)
    import mlx.core as mx

    vocab = program.metadata.vocab_size

    def prefill(prompts):
        sessions = [program.session(capacity=args.prompt_tokens + args.new_tokens + 8)
                    for _ in prompts]
        firsts = []
        for s, p in zip(sessions, prompts):  # prefill alone: decode is what is measured
            firsts.append(int(mx.argmax(s.step(mx.array([p]), range(len(p)))[0, -1]).item()))
        return sessions, firsts

    def batched(prompts):
        sessions, toks = prefill(prompts)
        out = [[t] for t in toks]
        t0 = time.perf_counter()
        for _ in range(args.new_tokens):
            rows = [(s, mx.array([[t]]), [s.length]) for s, t in zip(sessions, toks)]
            nxt = [mx.argmax(o[0, -1]) for o in program.step_batch(rows)]
            mx.eval(nxt)
            toks = [int(x.item()) for x in nxt]
            for o, t in zip(out, toks):
                o.append(t)
        return time.perf_counter() - t0, out

    def sequential(prompts):
        sessions, toks = prefill(prompts)
        out = [[t] for t in toks]
        t0 = time.perf_counter()
        for _ in range(args.new_tokens):
            for i, s in enumerate(sessions):
                t = int(mx.argmax(s.step(mx.array([[toks[i]]]), [s.length])[0, -1]).item())
                toks[i] = t
                out[i].append(t)
        return time.perf_counter() - t0, out

    results = []
    for b in args.batches:
        prompts = _prompts(b, args.prompt_tokens, vocab)
        batched(prompts[:1])  # warm-up
        row = {"batch": b}
        for name, fn in (("batched", batched), ("sequential", sequential)):
            best = None
            for _ in range(args.runs):
                dt, toks = fn(prompts)
                best = (dt, toks) if best is None or dt < best[0] else best
            dt, toks = best
            row[name] = {"tok_s": b * args.new_tokens / dt,
                         "step_ms": 1000 * dt / args.new_tokens, "tokens": toks}
        row["identical_rows"] = sum(a == c for a, c in zip(row["batched"]["tokens"],
                                                            row["sequential"]["tokens"]))
        print(f"  mlxgraph B={b}: batched {row['batched']['tok_s']:.1f} tok/s, sequential "
              f"{row['sequential']['tok_s']:.1f}", file=sys.stderr, flush=True)
        results.append(row)
    return {"engine": "mlxgraph", "blas": mlxgraph.blas_in_use().describe(), "rows": results}


def _mlx_lm(args):
    from pathlib import Path

    from common import mlx_lm_blas

    blas = mlx_lm_blas()
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.utils import load_model

    model, config = load_model(Path(args.model))
    vocab = config["vocab_size"]

    def run(prompts):
        b = len(prompts)
        gen = BatchGenerator(model, stop_tokens=None, completion_batch_size=b,
                             prefill_batch_size=b, max_tokens=args.new_tokens + 1)
        uids = gen.insert(prompts, [args.new_tokens + 1] * b)
        out = {u: [] for u in uids}
        t0, counted = None, 0
        while responses := gen.next_generated():
            for r in responses:
                out[r.uid].append(int(r.token))
            if t0 is None and all(out[u] for u in uids):
                t0, counted = time.perf_counter(), sum(len(v) for v in out.values())
        mx.eval()
        dt = time.perf_counter() - t0
        gen.close()
        made = sum(len(v) for v in out.values()) - counted
        return dt, made, [out[u] for u in uids]

    results = []
    for b in args.batches:
        prompts = _prompts(b, args.prompt_tokens, vocab)
        run(prompts[:1])  # warm-up
        best = None
        for _ in range(args.runs):
            dt, made, toks = run(prompts)
            best = (dt, made, toks) if best is None or dt < best[0] else best
        dt, made, toks = best
        steps = made / b
        results.append({"batch": b, "batched": {"tok_s": made / dt, "step_ms": 1000 * dt / steps,
                                                "tokens": toks}})
        print(f"  mlx-lm B={b}: {made / dt:.1f} tok/s", file=sys.stderr, flush=True)
    return {"engine": "mlx-lm", "blas": blas, "rows": results}


def main() -> int:
    """Run one engine over the batch sizes; print the result line."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=("mlxgraph", "mlx-lm"), required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",") if b]
    doc = _mlxgraph(args) if args.engine == "mlxgraph" else _mlx_lm(args)
    print("RESULT " + json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
