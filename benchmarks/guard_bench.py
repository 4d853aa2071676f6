"""Decode speed with and without the step's safety checks, measured in the same run.

    python benchmarks/guard_bench.py [--runs 7] [--tokens 128] [--json]

A Llama-shaped graph (the `tiny` size of benchmarks/generate_bench.py: hidden 256, 4 layers,
vocab 32000, seeded random weights, built with tests/synthetic_graphs.py) generates greedily
through the same pipelined loop as `mlxgraph generate` (generation/loop.py), where each
step's token ids are the previous step's lazy sampler output. Two variants alternate run
by run: ``checked`` is mlxgraph as it is (a lazy token id is clamped into the vocabulary
and flagged, the flag poisons the logits and is read back two steps later; every output's
size is checked on the first step of each shape); ``unchecked`` removes the token guard
(the checks of other shapes cost nothing at decode once the first step is done). Printed:
the median decode tok/s of each and the median over runs of checked/unchecked (each run's
pair back to back, in ABBA order), and the same for process CPU time per decoded token
(steadier than wall time when other work shares the machine).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mlxgraph.interpreter.native.blas import preload_blas

BLAS = preload_blas()  # as `mlxgraph generate` does, before mlx is imported

import mlx.core as mx  # noqa: E402

import mlxgraph  # noqa: E402
from mlxgraph.generation.loop import GenerationStats, generate  # noqa: E402
from mlxgraph.interpreter.session import session as session_module  # noqa: E402
from mlxgraph.tools.output import json_header_for  # noqa: E402

# The synthetic builder is test support (tests/synthetic_graphs.py), not the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from synthetic_graphs import llama  # noqa: E402

TINY = dict(
    layers=4, hidden=256, heads=4, kv_heads=2, intermediate=688, vocab=32000, max_context=512
)


def _decode(program, tokens: int, prompt) -> tuple:
    """(decode tok/s, process CPU ms per decoded token) of one greedy generation."""
    session = program.session(capacity=512)
    stats = GenerationStats()
    cpu = None
    for n, _ in enumerate(
        generate(session, prompt, lambda logits: mx.argmax(logits, axis=-1), tokens, (), 512, stats)
    ):
        if n == 0:
            cpu = time.process_time()  # after the prefill: decode only
    cpu = time.process_time() - cpu
    return stats.decode_tps, 1e3 * cpu / max(1, stats.generated_tokens - 1)


def main(argv=None) -> int:
    """Run the A/B and print the figures; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.mlxg"
        llama(**TINY).write(path)
        program = mlxgraph.load(path)
    prompt = list(range(1, 129))
    guarded_tokens = session_module.checked_tokens

    def unguarded_tokens(tokens, vocab, fail):
        if isinstance(tokens, mx.array):
            return tokens, None  # the session before this check: lazy ids went in as they were
        return guarded_tokens(tokens, vocab, fail)

    results = {"checked": [], "unchecked": []}
    cpu_ms = {"checked": [], "unchecked": []}
    _decode(program, 16, prompt)  # warm-up
    t0 = time.perf_counter()
    for run in range(args.runs):
        # ABBA order: a load that drifts during the run favours neither variant.
        for name in ("checked", "unchecked")[:: 1 if run % 2 == 0 else -1]:
            session_module.checked_tokens = (
                guarded_tokens if name == "checked" else unguarded_tokens
            )
            tps, ms = _decode(program, args.tokens, prompt)
            results[name].append(tps)
            cpu_ms[name].append(ms)
    session_module.checked_tokens = guarded_tokens
    med = {k: statistics.median(v) for k, v in results.items()}
    # Each run's checked/unchecked pair ran back to back: the median of their ratios is the
    # figure least moved by a machine whose load changes between runs.
    pair_ratio = statistics.median(c / u for c, u in zip(results["checked"], results["unchecked"]))
    # CPU time per token (all threads) moves less than wall time on a shared machine.
    cpu_ratio = statistics.median(c / u for c, u in zip(cpu_ms["checked"], cpu_ms["unchecked"]))
    doc = {
        **json_header_for(None),
        "model": TINY,
        "runs": args.runs,
        "tokens": args.tokens,
        "decode_tps": med,
        "ratio_checked_to_unchecked": pair_ratio,
        "cpu_ms_per_token": {k: statistics.median(v) for k, v in cpu_ms.items()},
        "cpu_ratio_checked_to_unchecked": cpu_ratio,
        "all_runs": results,
        "blas": BLAS.describe(),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        print(
            f"decode tok/s (median of {args.runs} runs, {args.tokens} tokens, tiny Llama; "
            f"BLAS {BLAS.describe()}):"
        )
        for k, v in med.items():
            print(f"  {k:<10} {v:8.1f}   runs: {', '.join(f'{x:.0f}' for x in results[k])}")
        print(
            f"  ratio checked/unchecked (median of the runs' back-to-back pairs): "
            f"{doc['ratio_checked_to_unchecked']:.3f}"
        )
        print(
            "  process CPU ms per decoded token: checked "
            f"{statistics.median(cpu_ms['checked']):.2f}, "
            f"unchecked {statistics.median(cpu_ms['unchecked']):.2f}, ratio (pairs) {cpu_ratio:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
