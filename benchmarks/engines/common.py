"""What the per-engine benchmark processes share: arguments, timing summary, result line.

Every engine is timed the same way by its own harness loop: ``t0`` just before the
engine's generate call, then the host time at which each generated token became known.
Prefill tok/s = prompt tokens / (first token time - t0); decode tok/s = (tokens - 1) /
(last token time - first token time). Each engine runs a short warm-up generation first,
then ``--runs`` measured ones; the best run (least disturbed by the shared machine) is
reported, with the median alongside.
"""

import argparse
import json
import os
import statistics
import sys
import time

RESULT_PREFIX = "RESULT "


def parse_args(argv=None) -> argparse.Namespace:
    """--model PATH --prompt-ids 1,2,3 --new-tokens N --runs R --warmup-tokens W."""
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--model", required=True, help="HF folder (mlx-lm, transformers) or .mlxg (mlxgraph)"
    )
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup-tokens", type=int, default=8)
    # torch engines only (MLX engines run on MLX's default device, in the file's dtype).
    ap.add_argument("--dtype", default="float32", help="transformers: the weights' dtype")
    ap.add_argument("--device", default="cpu", help="transformers: cpu or cuda")
    ap.add_argument("--int8-activations", action="store_true",
                    help="mlxgraph: load the graph with int8_activations")
    args = ap.parse_args(argv)
    args.prompt = [int(x) for x in args.prompt_ids.split(",")]
    return args


class Timer:
    """Collects the host time of each generated token of one run."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.times, self.tokens = [], []

    def token(self, tok: int) -> None:
        """Record that token ``tok`` is known now."""
        self.times.append(time.perf_counter())
        self.tokens.append(int(tok))

    def figures(self, prompt_len: int) -> dict:
        """prefill/decode tokens per second of this run."""
        first, last, n = self.times[0], self.times[-1], len(self.times)
        return {"prefill_tps": prompt_len / (first - self.t0),
                "decode_tps": (n - 1) / (last - first) if n > 1 else 0.0}


# The warm-up generation sees at most this many prompt tokens: it only has to touch every
# weight and kernel once, and a long-context run should not prefill twice.
WARMUP_PROMPT = 128


def run_all(generate_once, args) -> dict:
    """Warm up, run ``args.runs`` times, summarise. ``generate_once(prompt, n, timer)``."""
    generate_once(args.prompt[:WARMUP_PROMPT], args.warmup_tokens, Timer())
    runs = []
    for _ in range(args.runs):
        timer = Timer()
        generate_once(args.prompt, args.new_tokens, timer)
        runs.append(timer)
    figs = [r.figures(len(args.prompt)) for r in runs]
    # Imported only now: ``import mlxgraph`` before mlx arms its import hook, which puts
    # mlxgraph's BLAS under MLX (api/__init__.py), and a peer's process must run MLX as its
    # users have it (mlx-lm "as installed" measured 5x faster with the hook armed).
    from mlxgraph.tools.output import peak_rss_bytes

    return summarise(figs, [r.tokens for r in runs], peak_rss_bytes())


def summarise(figs: list, tokens: list, rss: int) -> dict:
    """Best and median prefill/decode tok/s of the runs, the first run's tokens, agreement."""
    return {
        "prefill_tps": max(f["prefill_tps"] for f in figs),
        "decode_tps": max(f["decode_tps"] for f in figs),
        "prefill_tps_median": statistics.median(f["prefill_tps"] for f in figs),
        "decode_tps_median": statistics.median(f["decode_tps"] for f in figs),
        "tokens": tokens[0],
        "runs_agree": all(t == tokens[0] for t in tokens),
        "peak_rss_bytes": rss,
    }


def mlx_lm_blas() -> str:
    """Before mlx-lm imports mlx: the BLAS its products will run on, as its users run it
    (MLX's own), or mlxgraph's preloaded OpenBLAS when ``BENCH_PRELOAD_BLAS=1`` (the
    labelled extra row)."""
    if os.environ.get("BENCH_PRELOAD_BLAS") != "1":
        return "MLX's own (as installed)"
    from mlxgraph.interpreter.native.blas import preload_blas

    return preload_blas().describe()


def emit(doc: dict) -> None:
    """Print the result as the last stdout line, for the orchestrator to parse."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(doc) + "\n")
    sys.stdout.flush()
