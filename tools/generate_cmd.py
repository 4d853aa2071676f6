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
    parse_ids,
    peak_rss_bytes,
    print_json,
)

DEFAULT_MAX_TOKENS = 128
DEFAULT_PREFILL_CHUNK = 512


def add_arguments(p) -> None:
    """Add generate's arguments to its subparser."""
    p.add_argument("graph", help="the .mlxg graph file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (tokenised with the graph's recorded tokenizer)")
    src.add_argument("--prompt-ids", help="prompt token ids, comma-separated (e.g. 1,2,3)")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"most tokens to generate (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0 = off)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling (default: random, reported)")
    p.add_argument("--capacity", type=int, default=None,
                   help="KV cache capacity in tokens (default: the graph's max context)")
    p.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK,
                   help=f"prompt tokens per prefill step (default {DEFAULT_PREFILL_CHUNK})")
    p.add_argument("--kv-dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="KV cache storage dtype (default: the compute dtype)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's EOS tokens")
    p.add_argument("--json", action="store_true", help="print one JSON document at the end, no streaming")


def _check_args(args) -> None:
    if args.max_tokens < 1:
        raise ToolError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.prefill_chunk < 1:
        raise ToolError(f"--prefill-chunk must be >= 1, got {args.prefill_chunk}")
    if args.capacity is not None and args.capacity < 1:
        raise ToolError(f"--capacity must be >= 1, got {args.capacity}")
    if not os.path.isfile(args.graph):
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
    import mlxgraph
    from mlxgraph.interpreter.errors import SessionError
    from mlxgraph.schema.errors import GraphFormatError
    from mlxgraph.tools.sampling import Sampler
    from mlxgraph.tools.tokenizer import TokenizerError, load_tokenizer

    try:
        program = mlxgraph.load(args.graph)
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
    try:
        session = program.session(capacity=args.capacity, kv_dtype=args.kv_dtype,
                                  max_step=args.prefill_chunk)
    except SessionError as e:
        raise ToolError(f"{args.graph}: {e}") from None
    full_attention = any(lc.sliding_window == 0 for lc in program.layers.values())
    if full_attention and len(prompt_ids) > session.capacity:
        raise ToolError(f"the prompt has {len(prompt_ids)} tokens, more than the KV capacity of "
                        f"{session.capacity} (--capacity, or the graph's max context)")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little") >> 1
    try:
        sampler = Sampler(args.temperature, args.top_k, args.top_p, seed)
    except ValueError as e:
        raise ToolError(str(e)) from None
    # The last generated token is never fed back, so capacity - prompt + 1 tokens fit.
    room = session.capacity - len(prompt_ids) + 1 if full_attention else args.max_tokens
    return program, tokenizer, prompt_ids, session, sampler, min(args.max_tokens, room)


def _run(args, blas) -> int:
    import mlx.core as mx

    from mlxgraph.interpreter.errors import GraphRuntimeError, SessionError
    from mlxgraph.interpreter.kv_cache import CacheError
    from mlxgraph.tools.generation import GenerationStats, generate
    from mlxgraph.tools.tokenizer import printable

    try:
        program, tokenizer, prompt_ids, session, sampler, max_tokens = _prepare(args)
    except ToolError as e:
        return fail(f"generate: {e}")
    stop = () if args.ignore_eos else tuple(program.metadata.eos_token_ids)
    stats = GenerationStats()
    stream = None if args.json else (tokenizer.stream_decoder() if tokenizer else None)
    out = sys.stdout
    if not args.json:
        out.write(printable(args.prompt) if args.prompt is not None else _echo_ids(tokenizer, prompt_ids))
        out.flush()
    tokens = []
    try:
        for token in generate(session, prompt_ids, sampler, max_tokens, stop, args.prefill_chunk, stats):
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
        print(f"mlxgraph: generate: {e}", file=sys.stderr)
        return 1
    if stats.stop_reason == "max_tokens" and max_tokens < args.max_tokens:
        stats.stop_reason = "capacity"
    doc = _stats_doc(stats, blas, sampler, mx)
    if args.json:
        body = _decode(tokenizer, tokens) if tokenizer else None
        print_json({**json_header({"file": program.graph}), "graph": str(args.graph),
                    "prompt_ids": list(prompt_ids), "token_ids": tokens, "text": body,
                    "stop_reason": stats.stop_reason, **doc})
        return 0
    if stream:
        out.write(printable(stream.flush()))
    out.write("\n")
    out.flush()
    _print_stats(stats, doc, blas, sys.stderr)
    source = program.metadata.extra.get("source", "")
    if source.startswith("tiny-"):
        # The built-ins are for trying the pipeline: say why their text reads as noise.
        print(f"model        {source}: seeded random weights, so the text is noise; export a Hugging Face "
              "model folder for real text", file=sys.stderr)
    return 0


def _decode(tokenizer, ids) -> str:
    """The text of ``ids`` as the stream decoder gives it (specials skipped)."""
    dec = tokenizer.stream_decoder()
    return "".join(dec.add(t) for t in ids) + dec.flush()


def _echo_ids(tokenizer, ids) -> str:
    from mlxgraph.tools.tokenizer import printable

    if tokenizer is None:
        return " ".join(str(i) for i in ids) + " |"
    return printable(_decode(tokenizer, ids))


def _stats_doc(stats, blas, sampler, mx) -> dict:
    return {
        "sampling": {"temperature": sampler.temperature, "top_k": sampler.top_k, "top_p": sampler.top_p,
                     "seed": None if sampler.greedy else sampler.seed},
        "stats": {
            "prompt_tokens": stats.prompt_tokens,
            "generated_tokens": stats.generated_tokens,
            "prefill_seconds": stats.prefill_seconds,
            "decode_seconds": stats.decode_seconds,
            "prefill_tokens_per_second": stats.prefill_tps,
            "decode_tokens_per_second": stats.decode_tps,
            "peak_memory_bytes": int(mx.get_peak_memory()),
            "peak_rss_bytes": peak_rss_bytes(),
            "blas": {"name": blas.name, "path": blas.path, "preloaded": blas.preloaded, "detail": blas.detail},
        },
    }


def _print_stats(stats, doc, blas, err) -> None:
    s = doc["stats"]
    seed = doc["sampling"]["seed"]
    mode = "greedy" if seed is None else f"sampled, seed {seed}"
    print("-" * 60, file=err)
    print(f"prompt     {stats.prompt_tokens:6d} tokens   prefill {stats.prefill_tps:9.1f} tok/s", file=err)
    print(f"generated  {stats.generated_tokens:6d} tokens   decode  {stats.decode_tps:9.1f} tok/s"
          f"   ({mode}; stopped: {stats.stop_reason.replace('_', ' ')})", file=err)
    print(f"peak memory  {human_bytes(s['peak_memory_bytes'])} MLX, {human_bytes(s['peak_rss_bytes'])} process RSS",
          file=err)
    print(f"BLAS         {blas.describe()}", file=err)
