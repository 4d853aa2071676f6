"""`mlxgraph export MODEL -o OUT.mlxg`: a Hugging Face model folder, Hub repo id or built-in
name to a graph file.

Progress lines go to stderr as each long step starts; the summary (or, with --json, one
JSON object) goes to stdout. Exit 0 on success; 2 for bad usage or bad input (an unknown
model name, a bad option, a folder or file that cannot be read); 1 when the model cannot be
exported exactly (one line, ``cannot export: <model type>: <where>: <why>``).
"""

import gc
import logging
import os
import sys
from contextlib import contextmanager

from mlxgraph.schema.format import format_version
from mlxgraph.tools.output import (
    fail,
    human_bytes,
    json_header_for,
    positive_int,
    print_json,
    process_seconds,
)

# export()'s parameters as this command's flags, for its error messages.
FLAGS = {"max_seq_len": "--max-seq-len", "dtype": "--dtype"}
# Quantization options that only mean something with --quantize.
QUANT_FLAGS = {"group_size": "--group-size", "quantize_embedding": "--quantize-embedding",
               "quantize_lm_head": "--quantize-lm-head", "quantize_exclude": "--quantize-exclude",
               "quantize_scales": "--quantize-scales"}
INSTALL_HINT = "export needs torch and transformers: pip install 'mlxgraph[export]'"


def add_arguments(parser) -> None:
    """Declare the command's arguments."""
    parser.add_argument(
        "model",
        help="a Hugging Face model folder (config.json + safetensors), a Hub repo id (org/name, "
        "fetched into the Hugging Face cache; offline, the cached copy) or a built-in name: "
        "tiny-code (trained on Python code), or tiny-llama, tiny-qwen2, tiny-mistral, "
        "tiny-gemma3, tiny-phi3 (seeded random weights)",
    )
    parser.add_argument("-o", "--output", required=True, help="the .mlxg file to write")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                        help="compute and weight dtype of the graph (default float32; an "
                        "MLX-quantized folder: its own)")
    parser.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=None,
        help="the most tokens one step may carry, and the recorded max context "
        "(default: 2048, or the model's max_position_embeddings when smaller)",
    )
    quant = parser.add_argument_group("quantized weights (format 1.2)")
    quant.add_argument("--quantize", choices=["q8", "q4"], default=None,
                       help="store Linear and embedding weights at 8 or 4 bits, group-wise "
                       "affine (MLX's layout); default: every weight in --dtype")
    quant.add_argument("--group-size", type=int, choices=[32, 64, 128], default=None,
                       help="weights per scale and bias (default 64)")
    quant.add_argument("--quantize-embedding", choices=["q8", "q4", "float"], default=None,
                       help="the token embedding's precision (default: as --quantize)")
    quant.add_argument("--quantize-lm-head", choices=["q8", "q4", "float"], default=None,
                       help="the output projection's precision (default: as --quantize)")
    quant.add_argument("--quantize-exclude", action="append", default=[], metavar="PATTERN",
                       help="keep modules whose path matches PATTERN (fnmatch, e.g. "
                       "'layers.0.*') in float; repeatable")
    quant.add_argument("--quantize-scales", choices=["float16", "float32"], default=None,
                       help="a float32 weight's scales and biases (default float16: 4.5 bits "
                       "per q4 weight; float32 where float16 cannot hold them)")
    parser.add_argument("--tokenizer", metavar="DIR", default=None,
                        help="embed this Hugging Face folder's tokenizer files (tokenizer.json, "
                        "its config and chat template) instead of the model folder's")
    parser.add_argument("--allow-nonfinite", action="store_true",
                        help="export weights holding NaN or infinity (refused by default)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _summary(stats: dict) -> str:
    top = list(stats["ops"].items())[:8]
    ops = ", ".join(f"{k} {v}" for k, v in top)
    more = len(stats["ops"]) - len(top)
    lines = [
        f"wrote {stats['path']} ({human_bytes(stats['file_bytes'])}) in {stats['seconds']:.1f} s",
        f"  model      {stats['model']} ({stats['parameters']:,} parameters, {stats['dtype']})",
        f"  nodes      {stats['nodes']}: {ops}" + (f", +{more} more op kinds" if more > 0 else ""),
        f"  constants  {stats['constants']} ({human_bytes(stats['constant_bytes'])})",
        f"  max T      {stats['max_seq_len']}",
        f"  tokenizer  {stats['tokenizer']}",
    ]
    q = stats.get("quantization")
    if q:
        done = ", ".join(f"{k} {v}" for k, v in q["nodes"].items() if v)
        how = ("the folder's own MLX weights, bit for bit" if q.get("source") == "mlx" else
               f"embedding {q['embedding']}, lm_head {q['lm_head']}")
        lines.append(f"  quantized  {q['mode']}, group size {q['group_size']}: {done} ({how})")
        lines += [f"  kept float {k}" for k in q["kept_float"]]
    needed = stats.get("element_limit_needed")
    if needed:
        lines.append(f"  note       a max-T step holds a tensor of {needed:,} elements, past the "
                     f"default load limit: load with element_limit={needed} "
                     f"(--element-limit {needed})")
    return "\n".join(lines)


# A generation-2 threshold no count reaches: no full collection runs while it is set.
_NEVER = 2**30


@contextmanager
def _young_collections_only():
    """Python's cyclic collector without its full collections for the block.

    Importing torch and transformers, then tracing, makes millions of objects that stay
    alive until the export ends (modules, fx graphs, fake tensors, sympy expressions), and
    each full collection walks all of them: about 1 s of the small Llama's 9 s export
    (benchmarks/quantize_export_bench.py), 1.4 s at load 5 on 2 cores. Young collections,
    which free short-lived cycles, still run (the peak memory is the same); garbage that
    outlives them waits for the next full collection after the block, or the exit.
    """
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], _NEVER)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def run(args) -> int:
    """Export; returns the exit code."""
    with _young_collections_only():
        return _run(args)


def _run(args) -> int:
    if args.max_seq_len is not None and args.max_seq_len < 2:
        return fail(f"export: --max-seq-len must be at least 2, got {args.max_seq_len}")
    if args.quantize is None:
        given = [flag for name, flag in QUANT_FLAGS.items()
                 if getattr(args, name) not in (None, [])]
        if given:
            return fail(f"export: {given[0]} needs --quantize q8|q4")
    try:
        import torch  # first: transformers without torch prints its own warning
        from transformers.utils import logging as hf_logging

        from mlxgraph.exporter import ExportError, UnsupportedModelError, export
        from mlxgraph.exporter.quantize import DEFAULT_GROUP_SIZE, QuantizeRecipe
    except ImportError as e:
        if e.name and e.name.split(".")[0] in ("torch", "transformers", "safetensors"):
            return fail(INSTALL_HINT)
        raise

    hf_logging.disable_progress_bar()  # our own progress lines say the same, once
    # transformers' warnings (a model that cannot switch its attention, unused weights...)
    # would bury the one line that says what happened; its errors still show.
    hf_logging.set_verbosity_error()
    if not os.environ.get("TORCH_LOGS"):
        # torch logs a failed trace's internals (tracebacks of meta kernels) at error level;
        # the refusal says what failed where. TORCH_LOGS, when set, still rules.
        torch._logging.set_logs(all=logging.CRITICAL)

    def progress(step: str) -> None:
        # Seconds since the process started: importing torch is part of the wait.
        if not args.json:
            print(f"[{process_seconds():6.1f}s] {step}...", file=sys.stderr, flush=True)

    try:
        stats = export(
            args.model,
            args.output,
            dtype=args.dtype,
            max_seq_len=args.max_seq_len,
            progress=progress,
            allow_nonfinite=args.allow_nonfinite,
            tokenizer=args.tokenizer,
            quantize=None if args.quantize is None else QuantizeRecipe(
                args.quantize, args.group_size or DEFAULT_GROUP_SIZE, args.quantize_embedding,
                args.quantize_lm_head, tuple(args.quantize_exclude),
                args.quantize_scales or "float16"),
        )
    except ExportError as e:
        return fail(f"export: {e.message_for(FLAGS)}")
    except UnsupportedModelError as e:
        print(f"mlxgraph: export: {args.model}: cannot export: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        return fail(f"export: {args.output}: {e.strerror or e}")
    stats["seconds"] = process_seconds()   # the wait the user saw, imports included
    if stats["tokenizer"] == "none":
        # Said at export, not first at generate: the folder's files are at hand now.
        print(f"mlxgraph: export: warning: {args.model} has no tokenizer.json, so the graph "
              "carries no tokenizer: generate/chat/serve will need token ids or --tokenizer "
              "DIR (export --tokenizer DIR embeds one)", file=sys.stderr)
    if args.json:
        print_json({**json_header_for(format_version()), **stats})
    else:
        print(_summary(stats))
    return 0
