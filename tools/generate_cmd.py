"""`mlxgraph generate GRAPH.mlxg (--prompt TEXT | --prompt-ids 1,2,3)`: stream text, then stats.

The text streams to stdout as tokens come; the stats (prompt and generated tokens,
prefill and decode tokens/s, peak memory, the BLAS in use) go to stderr afterwards, so
redirecting stdout keeps only the text. ``--json`` prints one document at the end instead.

Nothing here imports mlx at module level: the CLI imports this module to build its
parser, and an optimised BLAS must be loaded before mlx (interpreter/blas.py), which
``run`` does first.
"""

import os
import sys

from mlxgraph.tools.output import (
    ToolError,
    check_vocab,
    fail,
    human_bytes,
    json_header,
    non_negative_float,
    non_negative_int,
    parse_ids,
    peak_rss_bytes,
    positive_int,
    print_compute_note,
    print_json,
    probability_mass,
)

DEFAULT_MAX_TOKENS = 128
DEFAULT_PREFILL_CHUNK = 512


def add_arguments(p) -> None:
    """Add generate's arguments to its subparser."""
    p.add_argument("graph", help="the .mlxg graph file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (tokenised with the graph's recorded tokenizer)")
    src.add_argument("--prompt-ids", help="prompt token ids, comma-separated (e.g. 1,2,3)")
    p.add_argument("--max-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS,
                   help=f"most tokens to generate (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--temperature", type=non_negative_float, default=0.0,
                   help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=non_negative_int, default=0,
                   help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=probability_mass, default=1.0,
                   help="nucleus sampling mass (1.0 = off)")
    p.add_argument("--seed", type=non_negative_int, default=None,
                   help="random seed for sampling (default: random, reported)")
    p.add_argument("--capacity", type=positive_int, default=None,
                   help="KV cache capacity in tokens (default: the graph's max context)")
    p.add_argument("--prefill-chunk", type=positive_int, default=DEFAULT_PREFILL_CHUNK,
                   help=f"prompt tokens per prefill step (default {DEFAULT_PREFILL_CHUNK})")
    p.add_argument("--kv-dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="KV cache storage dtype (default: the compute dtype)")
    p.add_argument("--compute-dtype", choices=("float32",), help="widen float16/bfloat16 at load")
    p.add_argument("--kv-bits", type=int, choices=(4, 8), default=None,
                   help="store the KV cache quantized to 4 or 8 bits "
                        "(group-wise affine; default: floats)")
    p.add_argument("--kv-group-size", type=int, choices=(32, 64, 128), default=64,
                   help="elements per quantization group of --kv-bits (default 64)")
    p.add_argument("--window", type=int, default=None,
                   help="keep only the last N tokens on full-attention layers "
                        "(an approximation of the "
                        "model, reported; sliding-window layers keep their own window)")
    p.add_argument("--prompt-cache", metavar="FILE", default=None,
                   help="reuse FILE's KV cache when its history is a prefix of the prompt; "
                        "then save the "
                        "prompt's cache to FILE")
    p.add_argument("--ignore-eos", action="store_true",
                   help="do not stop at the model's EOS tokens")
    p.add_argument("--json", action="store_true", help="print one JSON document at the end, no "
                                                       "streaming")


def _check_args(args) -> None:
    if args.max_tokens < 1:
        raise ToolError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.prefill_chunk < 1:
        raise ToolError(f"--prefill-chunk must be >= 1, got {args.prefill_chunk}")
    if args.capacity is not None and args.capacity < 1:
        raise ToolError(f"--capacity must be >= 1, got {args.capacity}")
    if args.window is not None and args.window < 1:
        raise ToolError(f"--window must be >= 1, got {args.window}")
    if not os.path.exists(args.graph):
        raise ToolError(f"{args.graph}: no such file")


def run(args) -> int:
    """Generate; returns the exit code (0 ok, 1 the graph failed while running, 2 bad input)."""
    from mlxgraph.interpreter.blas import BlasError, preload_blas

    try:
        _check_args(args)
        blas = preload_blas()   # before anything imports mlx
    except (ToolError, BlasError) as e:
        return fail(f"generate: {e}")
    return _run(args, blas)


def _prepare(args):
    """Load the graph, tokenizer, prompt, session and sampler; raises ToolError."""
    from mlxgraph.interpreter.errors import SessionError
    from mlxgraph.interpreter.kv_cache import CacheError
    from mlxgraph.interpreter.program import Program
    from mlxgraph.schema.errors import GraphFormatError
    from mlxgraph.tools.sampling import Sampler
    from mlxgraph.tools.tokenizer import TokenizerError, load_tokenizer

    try:
        program = Program.load(args.graph, compute_dtype=args.compute_dtype)
    except GraphFormatError as e:
        raise ToolError(str(e)) from None
    except OSError as e:
        raise ToolError(f"{args.graph}: cannot read ({e.strerror or e})") from None
    meta = program.metadata
    tokenizer, tok_error = None, None
    try:
        tokenizer = load_tokenizer(meta, args.graph)
    except TokenizerError as e:
        tok_error = str(e)
    if args.prompt is not None:
        if tokenizer is None:
            raise ToolError(f"{args.graph}: {tok_error}")
        try:
            prompt_ids = tokenizer.encode(args.prompt)
        except TokenizerError as e:
            raise ToolError(str(e)) from None
        if not prompt_ids:
            raise ToolError("--prompt: the text encodes to no tokens")
    else:
        prompt_ids = parse_ids(args.prompt_ids)
    check_vocab(prompt_ids, meta.vocab_size, args.graph)
    windows = None
    if args.window is not None:  # full-attention layers only: a sliding layer's window is its math
        windows = {lid: lc.sliding_window or args.window for lid, lc in program.layers.items()}
    try:
        session = program.session(capacity=args.capacity, kv_dtype=args.kv_dtype,
                                  max_step=args.prefill_chunk, windows=windows,
                                  kv_bits=args.kv_bits or 0, kv_group_size=args.kv_group_size)
    except (SessionError, CacheError) as e:
        raise ToolError(f"{args.graph}: {e}") from None
    bounded = session.approximations
    full_attention = any(not (lc.sliding_window or lc.attention_chunk or bounded.get(lid))
                         for lid, lc in program.layers.items())
    if full_attention and len(prompt_ids) > session.capacity:
        raise ToolError(f"the prompt has {len(prompt_ids)} tokens, more than the KV capacity of "
                        f"{session.capacity} (--capacity, or the graph's max context)")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little") >> 1
    try:
        sampler = Sampler(args.temperature, args.top_k, args.top_p, seed)
    except ValueError as e:
        raise ToolError(str(e)) from None
    cache_report = None
    if args.prompt_cache:
        from mlxgraph.tools.prompt_cache import load_prompt_cache

        cache_report = load_prompt_cache(args.prompt_cache, session, prompt_ids)
    # The last generated token is never fed back, so capacity - prompt + 1 tokens fit.
    room = session.capacity - len(prompt_ids) + 1 if full_attention else args.max_tokens
    max_tokens = min(args.max_tokens, room)
    return program, tokenizer, prompt_ids, session, sampler, max_tokens, cache_report


def _run(args, blas) -> int:
    import mlx.core as mx

    from mlxgraph.interpreter.errors import GraphRuntimeError, SessionError
    from mlxgraph.interpreter.kv_cache import CacheError
    from mlxgraph.tools.generation import GenerationStats, generate
    from mlxgraph.tools.tokenizer import decode_all, printable

    try:
        program, tokenizer, prompt_ids, session, sampler, max_tokens, cache_report = _prepare(args)
    except ToolError as e:
        return fail(f"generate: {e}")
    stop = () if args.ignore_eos else tuple(program.metadata.eos_token_ids)
    stats = GenerationStats()
    stream = None if args.json else (tokenizer.stream_decoder() if tokenizer else None)
    out = sys.stdout
    if not args.json:
        prompt_text = printable(args.prompt) if args.prompt is not None else None
        out.write(prompt_text if prompt_text is not None else _echo_ids(tokenizer, prompt_ids))
        out.flush()
    tokens = []
    reused = cache_report.reused_tokens if cache_report else 0
    on_prefilled = None
    if cache_report is not None:
        from mlxgraph.tools.prompt_cache import save_prompt_cache

        def on_prefilled(s):
            save_prompt_cache(cache_report, s, prompt_ids)
    try:
        for token in generate(session, prompt_ids[reused:], sampler, max_tokens, stop,
                              args.prefill_chunk, stats, on_prefilled=on_prefilled):
            tokens.append(token)
            if args.json:
                continue
            piece = stream.add(token) if stream else f" {token}"
            if piece:
                out.write(printable(piece))
                out.flush()
    except (GraphRuntimeError, SessionError, CacheError) as e:
        if not args.json:
            out.write("\n")
        print(printable(f"mlxgraph: generate: {e}"), file=sys.stderr)
        return 1
    except ToolError as e:  # the prompt cache could not be written
        if not args.json:
            out.write("\n")
        return fail(f"generate: {e}")
    if stats.stop_reason == "max_tokens" and max_tokens < args.max_tokens:
        stats.stop_reason = "capacity"
    doc = _stats_doc(stats, blas, sampler, mx)
    doc["stats"]["compute"] = program.compute_info()
    doc["kv_cache"] = {**{k: session.policy[k] for k in ("kv_dtype", "kv_bits", "kv_group_size")},
                       "approximations": {str(k): v for k, v in session.approximations.items()}}
    doc["prompt_cache"] = cache_report.as_dict() if cache_report else None
    if args.json:
        body = decode_all(tokenizer, tokens) if tokenizer else None
        print_json({**json_header({"file": program.graph}), "graph": str(args.graph),
                    "prompt_ids": list(prompt_ids), "token_ids": tokens, "text": body,
                    "stop_reason": stats.stop_reason, **doc})
        return 0
    if stream:
        out.write(printable(stream.flush()))
    out.write("\n")
    out.flush()
    _print_stats(stats, doc, blas, sys.stderr)
    _print_cache_notes(doc, sys.stderr)
    source = program.metadata.extra.get("source", "")
    if source.startswith("tiny-") and program.metadata.tokenizer == "byte":
        # The random built-ins are for trying the pipeline: say why their text reads as noise
        # (tiny-code, the trained one, has a real tokenizer and reads like Python).
        print(f"model        {source}: seeded random weights, so the text is noise; export a "
              "Hugging Face "
              "model folder for real text", file=sys.stderr)
    return 0


def _echo_ids(tokenizer, ids) -> str:
    from mlxgraph.tools.tokenizer import decode_all, printable

    if tokenizer is None:
        return " ".join(str(i) for i in ids) + " |"
    return printable(decode_all(tokenizer, ids))


def _stats_doc(stats, blas, sampler, mx) -> dict:
    return {
        "sampling": {"temperature": sampler.temperature, "top_k": sampler.top_k,
                     "top_p": sampler.top_p, "seed": None if sampler.greedy else sampler.seed},
        "stats": {
            "prompt_tokens": stats.prompt_tokens,
            "generated_tokens": stats.generated_tokens,
            "prefill_seconds": stats.prefill_seconds,
            "decode_seconds": stats.decode_seconds,
            "prefill_tokens_per_second": stats.prefill_tps,
            "decode_tokens_per_second": stats.decode_tps,
            "peak_memory_bytes": int(mx.get_peak_memory()),
            "peak_rss_bytes": peak_rss_bytes(),
            "blas": blas.as_dict(),
        },
    }


def _print_stats(stats, doc, blas, err) -> None:
    s = doc["stats"]
    seed = doc["sampling"]["seed"]
    mode = "greedy" if seed is None else f"sampled, seed {seed}"
    print("-" * 60, file=err)
    print(f"prompt     {stats.prompt_tokens:6d} tokens   prefill {stats.prefill_tps:9.1f} tok/s",
          file=err)
    print(f"generated  {stats.generated_tokens:6d} tokens   decode  {stats.decode_tps:9.1f} tok/s"
          f"   ({mode}; stopped: {stats.stop_reason.replace('_', ' ')})", file=err)
    print(f"peak memory  {human_bytes(s['peak_memory_bytes'])} MLX, "
          f"{human_bytes(s['peak_rss_bytes'])} process RSS",
          file=err)
    print(f"BLAS         {blas.describe()}", file=err)
    print_compute_note(s["compute"], err)


def _print_cache_notes(doc, err) -> None:
    """The prompt cache's reuse and any window approximation, one line each."""
    pc = doc["prompt_cache"]
    if pc:
        note = f" ({pc['note']})" if pc["note"] else ""
        print(f"prompt cache {pc['reused_tokens']} tokens reused, {pc['saved_tokens']} saved "
              f"to {pc['path']}{note}", file=err)
    windows = doc["kv_cache"]["approximations"]
    if windows:
        by_window = {}
        for lid, w in windows.items():
            by_window.setdefault(w, []).append(lid)
        for w, lids in by_window.items():
            print(f"approximation: full-attention layers {','.join(lids)} keep only the last "
                  f"{w} tokens (--window)", file=err)
