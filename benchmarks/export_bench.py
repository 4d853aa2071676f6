"""Export time and graph file size: the tiny built-in Llama and a ~150M-parameter Llama.

    .venv/bin/python benchmarks/export_bench.py [--json] [--skip-large] [--dtype float32]

Each model is first saved as a local Hugging Face folder (config.json + safetensors, random
weights), then exported from that folder as a user would. Reported per model: parameters,
the safetensors bytes, the .mlxg bytes and their ratio (the peer: the weights as HF stores
them), the export time per step, the share of it that is mlxgraph's own work (lowering and
writing; the rest is torch.export and run_decompositions), and the export time as a ratio
to HF's own ``from_pretrained`` of the same folder (measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from mlxgraph.exporter import export  # noqa: E402
from mlxgraph.exporter.builtins import build_model, builtin_model  # noqa: E402
from mlxgraph.schema.format import format_version  # noqa: E402
from mlxgraph.tools.output import json_header_for  # noqa: E402

# ~150M parameters: 12 layers of hidden 768, untied 32k vocabulary (as a small Llama).
LARGE = dict(vocab_size=32000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
             num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=4096,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def _save(model, folder: Path) -> int:
    model.save_pretrained(folder)
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def measure(name: str, model, work: Path, dtype: str, max_seq_len: int) -> dict:
    """Save ``model`` as a folder, time HF's load of it, export it; returns the figures."""
    folder = work / name
    params = sum(p.numel() for p in model.parameters())
    st_bytes = _save(model, folder)
    del model
    t0 = time.perf_counter()
    AutoModelForCausalLM.from_pretrained(folder)
    hf_load = time.perf_counter() - t0
    stats = export(str(folder), work / f"{name}.mlxg", dtype=dtype, max_seq_len=max_seq_len)
    shutil.rmtree(folder)
    (work / f"{name}.mlxg").unlink()
    return {
        "model": name,
        "parameters": params,
        "dtype": dtype,
        "safetensors_bytes": st_bytes,
        "file_bytes": stats["file_bytes"],
        "size_ratio": stats["file_bytes"] / st_bytes,
        "nodes": stats["nodes"],
        "export_seconds": stats["seconds"],
        "hf_load_seconds": hf_load,
        "time_ratio_to_hf_load": stats["seconds"] / hf_load,
        "own_share": (stats["timings"]["lowering"] + stats["timings"]["writing"])
        / stats["seconds"],
        "steps": {k: round(v, 3) for k, v in stats["timings"].items()},
    }


def main(argv=None) -> int:
    """Run the benchmark; prints a table or JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--skip-large", action="store_true", help="only the tiny model")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--max-seq-len", type=int, default=2048)
    args = ap.parse_args(argv)
    hf_logging.disable_progress_bar()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlxgraph-export-bench-") as tmp:
        work = Path(tmp)
        rows.append(
            measure("tiny-llama", builtin_model("tiny-llama"), work, args.dtype, args.max_seq_len)
        )
        if not args.skip_large:
            # Built inline, not bound to a name here: measure() drops the only reference
            # before exporting, so the two copies of 150M parameters never coexist.
            rows.append(
                measure(
                    "llama-150m",
                    build_model(LlamaConfig(**LARGE), seed=0),
                    work,
                    args.dtype,
                    args.max_seq_len,
                )
            )
    if args.json:
        print(
            json.dumps(
                {
                    **json_header_for(format_version()),
                    "benchmark": "export",
                    "machine": platform.machine(),
                    "torch": torch.__version__,
                    "results": rows,
                },
                indent=2,
            )
        )
        return 0
    print(f"{'model':<12} {'params':>12} {'safetensors':>12} {'.mlxg':>12} {'size x':>7} "
          f"{'export s':>9} {'own %':>6} {'HF load s':>9} {'time x':>7}")
    for r in rows:
        print(
            f"{r['model']:<12} {r['parameters']:>12,} {r['safetensors_bytes']:>12,} "
            f"{r['file_bytes']:>12,} "
            f"{r['size_ratio']:>7.3f} {r['export_seconds']:>9.2f} {100 * r['own_share']:>6.1f} "
            f"{r['hf_load_seconds']:>9.2f} "
            f"{r['time_ratio_to_hf_load']:>7.1f}"
        )
        print(f"{'':<12} steps: " + ", ".join(f"{k} {v:.2f}s" for k, v in r["steps"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
