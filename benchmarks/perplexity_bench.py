"""Held-out loss of the trained built-in `tiny-code`: mlxgraph against transformers, per dtype.

    python benchmarks/perplexity_bench.py [--windows N] [--json]

The held-out files of scripts/tiny_code_corpus.txt are read from the running Python's
standard library (the count whose sha256 matches the pinned list is printed: the bits
per byte are the model card's figure only when all match), tokenized with the model's
tokenizer, and cut into windows of 256 tokens (the model's context) overlapping by one.
transformers computes the loss of every window in float32 (this process, torch); mlxgraph
exports the folder as float32, float16 and bfloat16 graphs and computes the same loss in a
child process (MLX with the preloaded BLAS, no torch), and with a float32 graph over a
float16, bfloat16, 8-bit and 4-bit KV cache, and float32 graphs of q8 and q4 weights
(``export --quantize``), exact and with int8 activations (``int8_activations``); with
llama-cpp-python and its converter installed (``make bench``), also llama.cpp's float32,
q8_0 and q4_0 GGUF files of the same folder (benchmarks/llama_cpp_gguf.py), fed the same
token ids. Printed per row: bits per byte, the loss's relative difference from
transformers float32, its tolerance (1e-4 for float32: the same computation; the others
are stated in ROWS) and tokens/s of the loss pass. Exit 1 when a row is outside its
tolerance.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from tiny_code_corpus import read_corpus, stdlib_root  # noqa: E402 - after the path

# (row, graph dtype, session options, relative tolerance of the summed held-out loss against
# transformers float32). float32 is the same computation: 1e-4. The others round weights,
# activations or the KV cache on purpose; their tolerances are about 10x what they measure
# on this model (docs/precision.md), so a regression shows.
ROWS = [
    ("float32", "float32", {}, 1e-4),
    ("float16", "float16", {}, 2e-5),
    ("bfloat16", "bfloat16", {}, 1e-3),
    ("float32, KV float16", "float32", {"kv_dtype": "float16"}, 1e-5),
    ("float32, KV bfloat16", "float32", {"kv_dtype": "bfloat16"}, 2e-4),
    ("float32, KV 8-bit", "float32", {"kv_bits": 8}, 1e-4),
    ("float32, KV 4-bit", "float32", {"kv_bits": 4}, 1e-2),
    # Quantized weights (export --quantize, group size 64): the issue's target is q8 within
    # 1% of float32; q4's tolerance is its stated figure with room (docs/precision.md).
    ("q8 weights", "float32", {}, 1e-2, "q8"),
    ("q4 weights", "float32", {}, 5e-2, "q4"),
    ("q4 weights, emb+head q8", "float32", {}, 1e-2, "q4+q8"),
    # int8 activations (a load option): x rounded to int8 per 32 values in every quantized
    # product, as llama.cpp's q8_0/q4_0 do; the same tolerances as the exact rows.
    ("q8 weights, int8 activations", "float32", {"int8_activations": True}, 1e-2, "q8"),
    ("q4 weights, int8 activations", "float32", {"int8_activations": True}, 5e-2, "q4"),
]
# Row options that are Program.load's, not the session's.
LOAD_OPTIONS = ("int8_activations",)
# A row's weight recipe (its optional fifth entry) as export's quantize argument.
RECIPES = {"q8": ("q8", None), "q4": ("q4", None), "q4+q8": ("q4", "q8")}
# llama.cpp's files of the same folder (GGUF type, tolerance): float32 is the same model
# (its own kernels); q8_0 and q4_0 (whose LM head llama.cpp keeps at 6 or 8 bits) stand
# beside mlxgraph's q8 and q4 rows, with the same tolerances.
LLAMA_ROWS = [("f32", 1e-3), ("q8_0", 1e-2), ("q4_0", 5e-2)]


def heldout_paths() -> set[str]:
    """The held-out files' paths in the pinned list."""
    from tiny_code_corpus import CORPUS_LIST

    return {line.split(" ", 3)[3] for line in CORPUS_LIST.read_text().splitlines()
            if line.startswith("heldout ")}


def token_windows(folder: Path, texts: list[str], length: int, limit: int):
    """(windows of token ids, UTF-8 bytes of each window's predicted tokens)."""
    from tokenizers import Tokenizer, pre_tokenizers

    from mlxgraph.tools.perplexity import windows

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = [i for enc in tok.encode_batch(texts) for i in enc.ids]
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    size = {
        i: (0 if t in special else sum(c in alphabet for c in t))
        for t, i in tok.get_vocab().items()
    }
    wins = windows(ids, length)
    wins = wins[:limit] if limit else wins
    return wins, [sum(size[i] for i in w[1:]) for w in wins]


def transformers_nll(folder: Path, wins) -> tuple[list[float], float]:
    """(summed NLL per window, seconds) of the folder's model in float32 with transformers."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from mlxgraph.tools.perplexity import nll_sum

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out, t0 = [], time.perf_counter()
    with torch.no_grad():
        for w in wins:
            logits = model(torch.tensor([w[:-1]])).logits[0]
            out.append(nll_sum(logits.numpy(), w[1:]))
    return out, time.perf_counter() - t0


def worker(graph: str, windows_file: str, options: str) -> int:
    """Child process: print the summed NLL per window and the seconds, as JSON."""
    from mlxgraph.interpreter.native.blas import preload_blas

    preload_blas()  # before mlx is imported
    import mlxgraph
    from mlxgraph.tools.perplexity import graph_nll

    session_options = json.loads(options)
    load_options = {k: session_options.pop(k) for k in LOAD_OPTIONS if k in session_options}
    program = mlxgraph.load(graph, **load_options)
    wins = json.loads(Path(windows_file).read_text())
    t0 = time.perf_counter()
    nll = [graph_nll(program, w, **session_options) for w in wins]
    print(json.dumps({"nll": nll, "seconds": time.perf_counter() - t0}))
    return 0


def llama_worker(gguf: str, windows_file: str) -> int:
    """Child process: the summed NLL per window under llama.cpp (llama-cpp-python) on a
    GGUF file, every position's logits from one batch per window, as JSON."""
    import numpy as np
    from llama_cpp import Llama

    from mlxgraph.tools.perplexity import nll_sum

    wins = json.loads(Path(windows_file).read_text())
    longest = max(len(w) for w in wins)
    threads = os.cpu_count() or 1  # as llama.cpp's users run it: a thread per core
    llm = Llama(model_path=gguf, n_ctx=longest, n_batch=longest, n_ubatch=longest,
                logits_all=True, n_threads=threads, n_threads_batch=threads, verbose=False)
    nll, t0 = [], time.perf_counter()
    for w in wins:
        llm.reset()
        llm.eval(w[:-1])
        nll.append(nll_sum(np.array(llm.scores[: len(w) - 1]), w[1:]))
    print(json.dumps({"nll": nll, "seconds": time.perf_counter() - t0}))
    return 0


def mlxgraph_nll(graph: Path, windows_file: Path, options: dict) -> dict:
    """Run the worker on ``graph`` with session ``options``; its JSON result."""
    cmd = [sys.executable, __file__, "--worker", str(graph), str(windows_file), json.dumps(options)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def llama_rows(folder: Path, windows_file: Path, tmp: Path) -> list:
    """The llama.cpp rows (none, with the reason printed, when it is not installed)."""
    from llama_cpp_gguf import convert, missing

    if reason := missing():
        print(f"perplexity_bench: no llama.cpp rows: {reason}", file=sys.stderr)
        return []
    files, rows = convert(folder, tmp / "gguf"), []
    for kind, tol in LLAMA_ROWS:
        cmd = [sys.executable, __file__, "--llama-worker", str(files[kind]), str(windows_file)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        got = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append({"name": f"llama.cpp {kind}", "nll": sum(got["nll"]),
                     "seconds": got["seconds"], "tolerance": tol})
    return rows


def measure(args) -> dict:
    """Every row's loss, bits per byte and relative difference from transformers float32."""
    from mlxgraph.exporter import export
    from mlxgraph.exporter.builtins import TRAINED_BUILTINS
    from mlxgraph.exporter.quantize import QuantizeRecipe

    folder = TRAINED_BUILTINS["tiny-code"]
    config = json.loads((folder / "config.json").read_text())
    splits, bad = read_corpus(stdlib_root())
    texts, matching = splits["heldout"], len(heldout_paths() - set(bad))
    wins, nbytes = token_windows(folder, texts, config["max_position_embeddings"], args.windows)
    tokens, total_bytes = sum(len(w) - 1 for w in wins), sum(nbytes)
    ref, ref_seconds = transformers_nll(folder, wins)
    ref_loss = sum(ref)
    rows = [{"name": "transformers float32", "nll": ref_loss, "seconds": ref_seconds}]
    with tempfile.TemporaryDirectory() as tmp:
        windows_file = Path(tmp) / "windows.json"
        windows_file.write_text(json.dumps(wins))
        for name, dtype, options, tol, *weights in ROWS:
            recipe = weights[0] if weights else None
            graph = Path(tmp) / f"tiny-code-{dtype}-{recipe or 'float'}.mlxg"
            if not graph.exists():
                export(str(folder), graph, dtype=dtype, quantize=None if recipe is None else
                       QuantizeRecipe(RECIPES[recipe][0], embedding=RECIPES[recipe][1],
                                      lm_head=RECIPES[recipe][1]))
            got = mlxgraph_nll(graph, windows_file, options)
            rows.append({"name": f"mlxgraph {name}", "nll": sum(got["nll"]),
                         "seconds": got["seconds"], "tolerance": tol})
        rows += llama_rows(folder, windows_file, Path(tmp))
    for row in rows:
        row["bits_per_byte"] = row["nll"] / 0.6931471805599453 / total_bytes
        row["nats_per_token"] = row["nll"] / tokens
        row["rel_diff"] = abs(row["nll"] - ref_loss) / ref_loss
        row["tokens_per_second"] = tokens / row["seconds"]
        row["ok"] = row["rel_diff"] <= row.get("tolerance", 0.0)
    return {
        "model": str(folder),
        "heldout_files": len(texts),
        "files_matching_pinned_list": matching,
        "windows": len(wins),
        "tokens": tokens,
        "bytes": total_bytes,
        "rows": rows,
    }


def print_table(doc: dict) -> None:
    """The rows as a table, then the speed ratio."""
    print(f"tiny-code held-out loss: {doc['heldout_files']} files "
          f"({doc['files_matching_pinned_list']} match the pinned list), {doc['windows']} windows, "
          f"{doc['tokens']} tokens, {doc['bytes']} bytes")
    print(f"{'engine':30s} {'bits/byte':>10s} {'nats/token':>11s} {'rel diff':>10s} "
          f"{'tolerance':>10s} {'tok/s':>8s}")
    for r in doc["rows"]:
        tol = f"{r['tolerance']:.0e}" if "tolerance" in r else "reference"
        mark = "" if r["ok"] or "tolerance" not in r else "  OUTSIDE TOLERANCE"
        print(f"{r['name']:30s} {r['bits_per_byte']:10.4f} {r['nats_per_token']:11.5f} "
              f"{r['rel_diff']:10.2e} {tol:>10s} {r['tokens_per_second']:8.0f}{mark}")
    ratio = doc["rows"][1]["tokens_per_second"] / doc["rows"][0]["tokens_per_second"]
    print(f"loss-pass speed, mlxgraph float32 / transformers float32: {ratio:.2f}x")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=0, help="use the first N windows (default: all)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--llama-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(*args.worker)
    if args.llama_worker:
        return llama_worker(*args.llama_worker)
    from mlxgraph.schema.format import format_version
    from mlxgraph.tools.output import json_header_for

    doc = measure(args)
    if args.json:
        print(json.dumps({**json_header_for(format_version()), **doc}, indent=1))
    else:
        print_table(doc)
    return 0 if all(r["ok"] for r in doc["rows"][1:]) else 1


if __name__ == "__main__":
    sys.exit(main())
