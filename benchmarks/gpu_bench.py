"""mlxgraph against mlx-lm and transformers on MLX's default device (a GPU where MLX has one).

    python benchmarks/gpu_bench.py [--size 1b|small|tiny] [--dtype bfloat16] [--prompt 128]
        [--new-tokens 128] [--runs 2] [--batches 1,8,32,64] [--engines ...] [--json]

One random Llama per size (seeded, built by benchmarks/engines/make_hf_folder.py in
``--dtype``): ``1b`` is Llama-3.2-1B's shape (1.24B parameters, vocab 128256, 16 layers,
hidden 2048, GQA 32/8, tied embeddings), ``small`` the generate benchmark's ~156M Llama,
``tiny`` one for CPU runs and the test. mlxgraph exports the folder in ``--dtype`` with
default flags. Each engine runs in its own process (benchmarks/engines/): mlxgraph
(``mlxgraph.load`` + the generation loop) and mlx-lm on MLX's default device, transformers
on CUDA when torch has it (else the CPU), all as their users run them. Printed: the device,
prefill and decode tok/s, decode as a fraction of the bandwidth bound (the device's read
bandwidth measured in the same run / bytes read per token), ratios to each peer, greedy
agreement, peak memory, and mlxgraph's aggregate decode over ``step_batch`` for each B.
It runs on a CPU-only machine too (``--size tiny``), which is how the test suite runs it.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

from generate_bench import ENGINE_DIR, ROOT, _prompt
from generate_bench import _run as run_checked
from generate_figures import COMMON, SIZES, agreement, bytes_per_token

GPU_SIZES = {
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
               tie_word_embeddings=True),
    "small": {**SIZES["small"], "tie_word_embeddings": False},
    "tiny": {**SIZES["tiny"], "vocab_size": 512, "num_hidden_layers": 2,
             "tie_word_embeddings": False},
}
ENGINES = ("mlxgraph", "mlx-lm", "transformers")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _run(cmd, what: str) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return run_checked(cmd, env=env, what=what)


def _result(out: str) -> dict:
    line = [x for x in out.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def device_worker() -> dict:
    """Child process: MLX's default device and its read bandwidth (a sum over a 2 GiB array
    on a GPU, best of 5; on the CPU every core's read, benchmarks/machine.py)."""
    import mlx.core as mx

    device = mx.default_device()
    doc = {"device": str(device), "gpu": device == mx.gpu}
    if not doc["gpu"]:
        from machine import measure_bandwidth

        doc["bandwidth"] = measure_bandwidth()["bound"]
        return doc
    a = mx.ones((2**30,), dtype=mx.bfloat16)
    mx.eval(a, a.sum())
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        mx.eval(a.sum())
        best = min(best, time.perf_counter() - t0)
    doc["bandwidth"] = a.nbytes / best
    return doc


def prepare(args, workdir: Path, log) -> tuple[Path, Path, dict]:
    """(HF folder, graph file, config) for ``args.size`` in ``args.dtype``, reused when built."""
    cfg = {**COMMON, **GPU_SIZES[args.size]}
    folder = workdir / f"hf-gpu-{args.size}-{args.dtype}"
    log(f"[{args.size}] building {folder} ...")
    _run([sys.executable, str(ENGINE_DIR / "make_hf_folder.py"), str(folder), "--config",
          json.dumps(cfg), "--dtype", args.dtype], "building the folder")
    graph = workdir / f"gpu-{args.size}-{args.dtype}-{args.prompt + args.new_tokens + 8}.mlxg"
    if not graph.is_file() or graph.stat().st_mtime < (folder / "config.json").stat().st_mtime:
        log(f"[{args.size}] exporting {graph} ...")
        _run([sys.executable, "-c", "import sys; from mlxgraph.exporter import export; "
              "export(sys.argv[1], sys.argv[2], dtype=sys.argv[3], max_seq_len=int(sys.argv[4]))",
              str(folder), str(graph), args.dtype, str(args.prompt + args.new_tokens + 8)],
             "exporting")
    return folder, graph, cfg


def run_engines(args, folder: Path, graph: Path, prompt: list, cuda: bool, log) -> dict:
    """Each engine's result document (generate loop, best of ``--runs``)."""
    scripts = {"mlxgraph": ("mlxgraph_engine.py", graph), "mlx-lm": ("mlx_lm_engine.py", folder),
               "transformers": ("transformers_engine.py", folder)}
    results = {}
    for engine in args.engines:
        script, model = scripts[engine]
        log(f"  {engine} ...")
        cmd = [sys.executable, str(ENGINE_DIR / script), "--model", str(model), "--prompt-ids",
               ",".join(map(str, prompt)), "--new-tokens", str(args.new_tokens), "--runs",
               str(args.runs), "--dtype", args.dtype, "--device", "cuda" if cuda else "cpu"]
        results[engine] = _result(_run(cmd, f"engine {engine}"))
    return results


def run_batches(args, graph: Path, log) -> list:
    """mlxgraph's aggregate decode for each B over ``Program.step_batch``."""
    if not args.batches:
        return []
    log(f"  mlxgraph step_batch B={args.batches} ...")
    cmd = [sys.executable, str(ENGINE_DIR / "batch_engine.py"), "--engine", "mlxgraph",
           "--model", str(graph), "--batches", args.batches, "--prompt-tokens",
           str(min(args.prompt, 64)), "--new-tokens", str(min(args.new_tokens, 32)),
           "--runs", "1"]
    return [{"batch": r["batch"], "tok_s": r["batched"]["tok_s"],
             "step_ms": r["batched"]["step_ms"], "sequential_tok_s": r["sequential"]["tok_s"]}
            for r in _result(_run(cmd, "step_batch"))["rows"]]


def summarise(doc: dict) -> None:
    """Add the bound, each engine's fraction of it, ratios and greedy agreement."""
    per_token = bytes_per_token(doc["config"], doc["prompt"] + doc["new_tokens"] / 2,
                                DTYPE_BYTES[doc["dtype"]])
    doc["bytes_per_token"] = per_token
    doc["decode_bound_tps"] = doc["device"]["bandwidth"] / per_token
    engines = doc["engines"]
    for r in engines.values():
        r["decode_fraction_of_bound"] = r["decode_tps"] / doc["decode_bound_tps"]
    ours = engines.get("mlxgraph")
    doc["ratios"] = {
        peer: {"prefill": ours["prefill_tps"] / r["prefill_tps"],
               "decode": ours["decode_tps"] / r["decode_tps"],
               "greedy_tokens": agreement(ours["tokens"], r["tokens"])}
        for peer, r in engines.items() if ours and peer != "mlxgraph"
    }


def print_report(doc: dict) -> None:
    """The tables of one gpu_bench document."""
    dev = doc["device"]
    print(f"gpu bench: {doc['size']} Llama, {doc['dtype']}, prompt {doc['prompt']}, "
          f"{doc['new_tokens']} greedy tokens, best of {doc['runs']} after a warm-up; MLX device "
          f"{dev['device']}, read {dev['bandwidth'] / 1e9:.0f} GB/s; "
          f"{doc['bytes_per_token'] / 1e9:.2f} GB read per token -> bound "
          f"{doc['decode_bound_tps']:.0f} tok/s")
    print(f"  {'engine':<14}{'prefill tok/s':>14}{'decode tok/s':>14}{'of bound':>10}"
          f"{'peak memory':>13}")
    for name, r in doc["engines"].items():
        peak = r.get("peak_mlx_bytes") or r.get("peak_device_bytes") or r["peak_rss_bytes"]
        print(f"  {name:<14}{r['prefill_tps']:>14.1f}{r['decode_tps']:>14.1f}"
              f"{r['decode_fraction_of_bound']:>10.0%}{peak / 2**30:>11.2f}Gi")
    for peer, q in doc["ratios"].items():
        print(f"  mlxgraph/{peer:<14} prefill {q['prefill']:5.2f}x  decode {q['decode']:5.2f}x  "
              f"greedy tokens {q['greedy_tokens']}")
    for r in doc["batches"]:
        print(f"  mlxgraph step_batch B={r['batch']:<3} {r['tok_s']:9.1f} tok/s aggregate "
              f"({r['step_ms']:.1f} ms/step; sessions one after another "
              f"{r['sequential_tok_s']:.1f})")


def main(argv=None) -> int:
    """Run the benchmark; prints the tables (or --json)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1b", choices=list(GPU_SIZES))
    ap.add_argument("--dtype", default="bfloat16", choices=list(DTYPE_BYTES))
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--batches", default="1,8,32,64", help="step_batch sizes ('' = none)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--workdir", default=str(ROOT / "out" / "bench"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.device_worker:
        print("RESULT " + json.dumps(device_worker()))
        return 0
    args.engines = [e for e in args.engines.split(",") if e]
    if not set(args.engines) <= set(ENGINES) or "mlxgraph" not in args.engines:
        print(f"gpu_bench: --engines takes mlxgraph and any of {', '.join(ENGINES)}",
              file=sys.stderr)
        return 2
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    device = _result(_run([sys.executable, __file__, "--device-worker"], "the device probe"))
    cuda = "transformers" in args.engines and _run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], "torch probe"
    ).strip().endswith("True")
    folder, graph, cfg = prepare(args, workdir, log)
    prompt = _prompt(args.prompt, cfg["vocab_size"])
    doc = {"benchmark": "gpu", "size": args.size, "dtype": args.dtype, "config": cfg,
           "prompt": args.prompt, "new_tokens": args.new_tokens, "runs": args.runs,
           "device": device, "torch_device": "cuda" if cuda else "cpu",
           "engines": run_engines(args, folder, graph, prompt, cuda, log),
           "batches": run_batches(args, graph, log)}
    summarise(doc)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
