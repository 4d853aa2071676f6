"""Quantized weights on the CPU: matrix-vector kernels; float32, q8 and q4 graphs side by side
with llama.cpp's float32, q8_0 and q4_0 files of the same model.

    python benchmarks/quantized_bench.py [--models tiny-code,small] [--prompt 128]
        [--decode 64] [--runs 3] [--processes 3] [--workdir DIR] [--json]

Part 1, the issue's product (W 1024 x 2816, one row of x): float32 through the preloaded
BLAS (the router's sgemv), MLX's ``mx.quantized_matmul`` and mlxgraph's native kernel at
q8 and q4 (group 64; 1 and 2 threads); best-of-5 ms per product and each one's ratio to
float32.

Part 1 also times the prefill products of the small model at ``--prompt`` rows (its
weights' shapes, q8 and q4, group 64, float16 scales as the export stores them): the old
path (the native dequantize of the whole weight, then MLX's matmul on the router) against
the tiled product that dequantizes a tile at a time (interpreter/native/quantized_tile.h),
called in turns in one process (this VM's speed drifts over seconds); median ms of each
and old/tiled (> 1: the tiled product is faster).

Part 2, per model: ``tiny-code`` (the trained built-in) and ``small`` (the generate
benchmark's ~156M Llama, seeded random weights, tiny-code's tokenizer added so llama.cpp's
converter takes the folder). The folder is exported as float32, q8 and q4 graphs and converted
by llama.cpp's tools to float32, q8_0 and q4_0 GGUF files (benchmarks/llama_cpp_gguf.py;
``make bench`` installs llama-cpp-python and unpacks its converter; without them the llama.cpp
rows are skipped and say why). Every engine runs in its own process (benchmarks/engines/): a
``--prompt``-token prompt, then ``--decode`` greedy tokens, best of ``--runs``; each engine
runs in ``--processes`` processes, all rows taken in turns (a process keeps its memory-
bandwidth luck for its life: 26-50 GB/s on this VM), best of all, each process's decode
printed too; printed are file size (and its ratio to the same engine's float32 file), prefill
and decode tok/s, decode against llama.cpp at the same bit width, and peak memory. Peers run
as their users run them: llama.cpp with a thread per core and OpenMP's default wait policy
(``OMP_WAIT_POLICY`` is dropped from its environment; ``--llama-cpp-passive`` adds labelled
rows with the passive policy). The machine's CPU, load average at the start and the end, and
its all-core memory read bandwidth are printed (benchmarks/machine.py), with each row's decode
as bytes read per token x tok/s: the file's weights but the embedding table (untied models
gather one row of it) plus the float32 K/V at the average context. The acceptance check: the
native kernel's greedy tokens equal those of the same graph on MLX's own op
(``MLXGRAPH_QUANTIZED_KERNEL=mlx``: the dequantized weight in float32); the script exits 1
otherwise. The labelled "int8 act." rows load the q8/q4 graphs with ``int8_activations`` (x
rounded to int8 per 32 values, as llama.cpp's q8_0/q4_0 products do; not the default): their
last column is their greedy tokens' agreement with the exact graph's (their loss:
perplexity_bench.py).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from generate_figures import bytes_per_token
from machine import describe, load_average, machine_facts, measure_bandwidth
from quantized_products import COLS, GROUP, W_ROWS, matvec_worker

ENGINES = Path(__file__).resolve().parent / "engines"
# (row name, graph mode or GGUF type, engine script, environment, engine flags); llama.cpp
# rows last. The int8 rows load the q8/q4 graphs with int8_activations (x rounded to int8
# per 32 values, as llama.cpp's q8_0/q4_0 do): not the default, so labelled.
INT8 = ("--int8-activations",)
ROWS = [
    ("mlxgraph float32", "float32", "mlxgraph_engine.py", {}, ()),
    ("mlxgraph q8", "q8", "mlxgraph_engine.py", {}, ()),
    ("mlxgraph q4", "q4", "mlxgraph_engine.py", {}, ()),
    ("mlxgraph q8 int8 act.", "q8", "mlxgraph_engine.py", {}, INT8),
    ("mlxgraph q4 int8 act.", "q4", "mlxgraph_engine.py", {}, INT8),
    ("llama.cpp f32", "f32", "llama_cpp_engine.py", {}, ()),
    ("llama.cpp q8_0", "q8_0", "llama_cpp_engine.py", {}, ()),
    ("llama.cpp q4_0", "q4_0", "llama_cpp_engine.py", {}, ()),
]
# --llama-cpp-passive: labelled extra rows with a non-default setting of the peer.
PASSIVE_ROWS = [
    (f"{name} passive", kind, script, {"OMP_WAIT_POLICY": "PASSIVE"}, ())
    for name, kind, script, _, _ in ROWS if script == "llama_cpp_engine.py"
]
# The reference of each quantized graph: MLX's own op on the same file.
REFERENCE_ENV = {"MLXGRAPH_QUANTIZED_KERNEL": "mlx"}
PEER = {"float32": "f32", "q8": "q8_0", "q4": "q4_0"}


def model_folder(name: str, workdir: Path) -> Path:
    """The Hugging Face folder of ``name``: tiny-code's own, or the small Llama built once
    in ``workdir`` with tiny-code's tokenizer (llama.cpp's converter needs one)."""
    from mlxgraph.exporter.builtins import TRAINED_BUILTINS

    if name in TRAINED_BUILTINS:
        return TRAINED_BUILTINS[name]
    from generate_figures import COMMON, SIZES

    folder = workdir / f"hf-{name}"
    subprocess.run([sys.executable, str(ENGINES / "make_hf_folder.py"), str(folder),
                    "--config", json.dumps({**SIZES[name], **COMMON})], check=True)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TRAINED_BUILTINS["tiny-code"] / file, folder / file)
    return folder


def run_engine(script: str, model: Path, prompt: list, args, env: dict, runs: int,
               flags: tuple = ()) -> dict:
    """One engine process; its result document."""
    cmd = [sys.executable, str(ENGINES / script), "--model", str(model), "--prompt-ids",
           ",".join(map(str, prompt)), "--new-tokens", str(args.decode), "--runs", str(runs),
           *flags]
    # The peer's defaults unless the row sets them: no wait policy inherited from here.
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run(cmd, capture_output=True, text=True, env={**base, **env})
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-2000:] + done.stderr[-4000:])
        raise SystemExit(f"quantized_bench: {script} on {model.name} failed")
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def best_of_processes(docs: list) -> dict:
    """One row from its processes' documents: the best prefill and decode of all, each
    process's best decode (the spread), tokens from the first (all must agree)."""
    r = dict(docs[0])
    r["prefill_tps"] = max(d["prefill_tps"] for d in docs)
    r["decode_tps"] = max(d["decode_tps"] for d in docs)
    r["decode_tps_processes"] = [d["decode_tps"] for d in docs]
    r["peak_rss_bytes"] = max(d["peak_rss_bytes"] for d in docs)
    r["runs_agree"] = all(d["runs_agree"] and d["tokens"] == r["tokens"] for d in docs)
    return r


def bench_model(name: str, args, workdir: Path) -> dict:
    """Export, convert and run every row for one model."""
    import random

    from llama_cpp_gguf import convert, missing

    from mlxgraph.exporter import export
    from mlxgraph.exporter.quantize import QuantizeRecipe

    folder = model_folder(name, workdir)
    cfg = json.loads((folder / "config.json").read_text())
    vocab = cfg["vocab_size"]
    rng = random.Random(1234)
    prompt = [rng.randrange(3, vocab) for _ in range(args.prompt)]
    files = {}
    for mode in ("float32", "q8", "q4"):
        files[mode] = workdir / f"{name}-{mode}-{args.prompt + args.decode + 8}.mlxg"
        if not files[mode].is_file():
            recipe = None if mode == "float32" else QuantizeRecipe(mode)
            export(str(folder), files[mode], quantize=recipe,
                   max_seq_len=args.prompt + args.decode + 8)
    llama_missing = missing()
    if not llama_missing:
        files.update(convert(folder, workdir / "gguf"))
    plan = [spec for spec in ROWS + (PASSIVE_ROWS if args.llama_cpp_passive else [])
            if spec[1] in files]
    # Every row in --processes processes, taken in turns: on this VM one process's memory
    # reads 26-50 GB/s with two threads and keeps its luck for its life, so one process per
    # row decides a ratio by chance (both engines alike).
    done = {}
    for _ in range(args.processes):
        for row, kind, script, env, flags in plan:
            done.setdefault(row, []).append(
                run_engine(script, files[kind], prompt, args, env, args.runs, flags))
    rows = []
    for row, kind, script, env, flags in plan:
        r = best_of_processes(done[row])
        r.update(name=row, kind=kind, file_bytes=files[kind].stat().st_size, labelled=bool(
            flags or env))
        r["bytes_per_token"] = read_per_token(cfg, r["file_bytes"], args.prompt + args.decode / 2)
        r["decode_bytes_per_s"] = r["bytes_per_token"] * r["decode_tps"]
        if kind in ("q8", "q4") and not flags:
            ref = run_engine(script, files[kind], prompt, args, REFERENCE_ENV, 1)
            r["tokens_equal_mlx_op"] = r["tokens"] == ref["tokens"]
        rows.append(r)
    by_kind = {r["kind"]: r for r in rows if not r["labelled"]}
    for r in rows:  # int8 activations: greedy agreement with the exact graph's tokens
        if r["labelled"] and r["engine"] == "mlxgraph":
            exact = by_kind[r["kind"]]["tokens"]
            r["tokens_agree_exact"] = [sum(a == b for a, b in zip(r["tokens"], exact)),
                                       len(exact)]
    for r in rows:
        f32 = by_kind["float32" if r["engine"] == "mlxgraph" else "f32"]
        r["size_ratio"] = r["file_bytes"] / f32["file_bytes"]
        peer = by_kind.get(PEER.get(r["kind"], ""))
        r["decode_vs_llama_cpp"] = peer and r["decode_tps"] / peer["decode_tps"]
        r["prefill_vs_llama_cpp"] = peer and r["prefill_tps"] / peer["prefill_tps"]
    return {"model": name, "prompt": args.prompt, "decode": args.decode, "rows": rows,
            "llama_cpp": llama_missing or "measured"}


def read_per_token(cfg: dict, file_bytes: int, context: float) -> float:
    """Bytes one decode step reads from a file of ``file_bytes``: its share of weights that
    are not the embedding table (whole when the table is the tied LM head), plus float32 K/V."""
    layers_and_head = bytes_per_token(cfg, 0, 1)
    table = 0 if cfg.get("tie_word_embeddings") else cfg["vocab_size"] * cfg["hidden_size"]
    kv = bytes_per_token(cfg, context) - bytes_per_token(cfg, 0)
    return file_bytes * layers_and_head / (layers_and_head + table) + kv


def _matvec_child(prompt: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--matvec-worker", "--prompt", str(prompt)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args) -> dict:
    """Both parts; folders, graphs and GGUF files go to ``--workdir`` (kept and reused) or
    a temporary folder."""
    facts = machine_facts()
    doc = {"machine": facts, "bandwidth": measure_bandwidth(),
           "matvec": _matvec_child(args.prompt), "models": []}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in args.models.split(","):
            doc["models"].append(bench_model(name, args, workdir))
    facts["load_end"] = load_average()
    return doc


def _mb(n: int) -> str:
    return f"{n / 2**20:8.1f}MB"


def print_table(doc: dict) -> None:
    """Both parts as tables."""
    print(f"machine: {describe(doc['machine'], doc['bandwidth'])}")
    m = doc["matvec"]
    print(f"W {W_ROWS} x {COLS}, one row, group {GROUP}; quantized kernel: {m['native']}")
    f32 = m["ms"]["float32 (BLAS)"]
    for name, ms in m["ms"].items():
        print(f"  {name:32s} {ms:8.3f} ms   {f32 / ms:5.2f}x float32")
    if m["prefill"]:
        print("prefill products (x @ W.T, group 64, float16 scales), median ms in turns:")
    for r in m["prefill"]:
        print(f"  q{r['bits']} {r['shape']:16s} old (dequantize + matmul) {r['old']:7.2f}  "
              f"tiled {r['tiled']:7.2f}   {r['old'] / r['tiled']:5.2f}x")
    for model in doc["models"]:
        print(f"\n{model['model']}: {model['prompt']}-token prompt, {model['decode']} greedy "
              f"tokens (llama.cpp: {model['llama_cpp']})")
        print(f"{'engine':24s} {'file':>10s} {'size':>6s} {'prefill':>8s} {'decode':>8s} "
              f"{'GB/s':>5s} {'decode/llama.cpp':>16s} {'prefill/l.cpp':>13s} {'peak RSS':>10s} "
              f"{'= MLX op':>8s}")
        for r in model["rows"]:
            same = {True: "yes", False: "NO", None: "-"}[r.get("tokens_equal_mlx_op")]
            if "tokens_agree_exact" in r:
                same = "{}/{}".format(*r["tokens_agree_exact"])
            vs = f"{r['decode_vs_llama_cpp']:.2f}x" if r["decode_vs_llama_cpp"] else "-"
            pvs = f"{r['prefill_vs_llama_cpp']:.2f}x" if r["prefill_vs_llama_cpp"] else "-"
            print(f"{r['name']:24s} {_mb(r['file_bytes'])} {r['size_ratio']:6.3f} "
                  f"{r['prefill_tps']:8.0f} {r['decode_tps']:8.1f} "
                  f"{r['decode_bytes_per_s'] / 1e9:5.1f} {vs:>16s} {pvs:>13s} "
                  f"{_mb(r['peak_rss_bytes'])} {same:>8s}")
        print("decode tok/s per process (best of its runs), in the order they ran:")
        for r in model["rows"]:
            each = " ".join(f"{t:6.1f}" for t in r["decode_tps_processes"])
            print(f"  {r['name']:24s} {each}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny-code,small",
                    help="comma-separated: tiny-code and/or small")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3,
                    help="measured runs per engine process (best counts)")
    ap.add_argument("--processes", type=int, default=3,
                    help="processes per engine, in turns with the other engines (best counts)")
    ap.add_argument("--workdir", help="keep (and reuse) folders, graphs and GGUF files here")
    ap.add_argument("--llama-cpp-passive", action="store_true",
                    help="also llama.cpp with OMP_WAIT_POLICY=PASSIVE (labelled rows)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--matvec-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.matvec_worker:
        print(json.dumps(matvec_worker(args.prompt)))
        return 0
    doc = measure(args)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print_table(doc)
    same = [r["tokens_equal_mlx_op"] for m in doc["models"] for r in m["rows"]
            if "tokens_equal_mlx_op" in r]
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
