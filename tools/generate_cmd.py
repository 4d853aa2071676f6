"""`mlxgraph generate GRAPH.mlxg (--prompt TEXT | --prompt-file F | --prompt-ids 1,2,3)`: stream
text, then stats.

The text streams to stdout as tokens come; the stats (prompt and generated tokens,
prefill and decode tokens/s, peak memory, the BLAS in use) go to stderr afterwards, so
redirecting stdout keeps only the text. ``--json`` prints one document at the end instead.
Built on :func:`mlxgraph.stream_generate` (generation/text.py).

Nothing here imports mlx at module level: the CLI imports this module to build its
parser, and an optimised BLAS must be loaded before mlx (interpreter/native/blas.py), which
``run`` does first.
"""

import sys

from mlxgraph.tools.generate_report import (
    half_matvec_stats,
    native_ops_stats,
    print_cache_notes,
    print_stats,
    quantized_stats,
    stats_doc,
)
from mlxgraph.tools.option_table import add_options
from mlxgraph.tools.output import (
    ToolError,
    check_vocab,
    fail,
    json_header,
    parse_ids,
    print_json,
    printable,
)
from mlxgraph.tools.pipeline_cli import (
    add_pipeline_options,
    check_pipeline_options,
    pipeline_doc,
    print_pipeline,
    quiet_unless_first,
    share_seed,
)
from mlxgraph.tools.text_options import open_session, template_stops, text_options


def add_arguments(p) -> None:
    """Add generate's arguments to its subparser."""
    p.add_argument("graph", help="the .mlxg graph file, or a model: a Hugging Face folder, "
                   "Hub repo id or built-in name, exported once into the graph cache")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--prompt",
        help="prompt text (the chat template is applied when the tokenizer has one); - reads stdin",
    )
    src.add_argument("--prompt-file", help="read the prompt text from this file (UTF-8)")
    src.add_argument(
        "--prompt-ids", help="prompt token ids, comma-separated (e.g. 1,2,3), used as they are"
    )
    add_options(p, "generate")
    p.add_argument(
        "--prompt-cache",
        metavar="FILE",
        default=None,
        help="reuse FILE's KV cache when its history is a prefix of the prompt; "
        "then save the "
        "prompt's cache to FILE",
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON document at the end, no streaming"
    )
    add_pipeline_options(p)


def read_prompt(args) -> str | None:
    """The prompt text from --prompt (``-`` = stdin) or --prompt-file; None for --prompt-ids.

    Raises:
        ToolError: the file cannot be read or is not UTF-8.
    """
    if args.prompt == "-":
        return sys.stdin.read()
    if args.prompt_file is None:
        return args.prompt
    try:
        with open(args.prompt_file, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ToolError(f"--prompt-file: {args.prompt_file}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ToolError(
            f"--prompt-file: {args.prompt_file}: not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None


def run(args) -> int:
    """Generate; returns the exit code (0 ok, 2 bad input, 3 the graph failed while running,
    130 interrupted)."""
    from mlxgraph.interpreter.native.blas import BlasError, preload_blas
    from mlxgraph.tools.model_graphs import ModelGraphError

    try:
        if args.system_prompt is not None and args.ignore_chat_template:
            raise ToolError("--system-prompt needs the chat template; drop --ignore-chat-template")
        if args.chat_template is not None and args.ignore_chat_template:
            raise ToolError("--chat-template and --ignore-chat-template contradict each other")
        options = text_options(args)
        check_pipeline_options(args)
        args.prompt = read_prompt(args)
        blas = preload_blas()  # before anything imports mlx
    except (ToolError, BlasError) as e:
        return fail(f"generate: {e}")
    except ModelGraphError as e:
        return e.code
    return _run(args, options, blas)


def _prepare(args, options):
    """(program, tokenizer, prompt ids, stop ids, session, sampler, chat, prompt cache report);
    raises ToolError."""
    from mlxgraph.generation.sampling import make_sampler
    from mlxgraph.generation.text import has_full_attention, prompt_to_ids, stop_ids
    from mlxgraph.interpreter.text.tokenizer import TokenizerError

    text = args.prompt
    program, tokenizer = options.source.open(need_tokenizer=text is not None, deadline=True)
    chat = False
    try:
        if text is not None:
            chat = tokenizer.chat_template is not None and not args.ignore_chat_template
            if args.system_prompt is not None and tokenizer.chat_template is None:
                raise ToolError(
                    f"--system-prompt needs a chat template; the {tokenizer.name} "
                    "tokenizer has none (--tokenizer DIR uses another folder's)"
                )
            ids = prompt_to_ids(tokenizer, text, chat, args.system_prompt)
        else:
            if args.system_prompt is not None:
                raise ToolError("--system-prompt needs a text prompt (--prompt or --prompt-file)")
            ids = parse_ids(args.prompt_ids)
        eos = stop_ids(program, tokenizer, args.extra_eos_token, args.ignore_eos)
    except TokenizerError as e:
        raise ToolError(str(e)) from None
    check_vocab(ids, program.metadata.vocab_size, args.graph)
    sampling = share_seed(program, options.sampling)
    session = open_session(program, options.session, args.graph)
    if has_full_attention(program, session) and len(ids) > session.capacity:
        raise ToolError(
            f"the prompt has {len(ids)} tokens, more than the KV capacity of "
            f"{session.capacity} ({session.capacity_reason}; --capacity sets it)"
        )
    sampler = make_sampler(sampling)
    cache_report = None
    if args.prompt_cache:
        from mlxgraph.tools.prompt_cache import load_prompt_cache

        cache_report = load_prompt_cache(args.prompt_cache, session, ids)
    return program, tokenizer, ids, eos, session, sampler, chat, cache_report


def _run(args, options, blas) -> int:
    import mlx.core as mx

    from mlxgraph.generation.loop import GenerationStats
    from mlxgraph.generation.text import stream_generate
    from mlxgraph.interpreter.cache.kv_cache import CacheError
    from mlxgraph.interpreter.errors import GraphRuntimeError, PipelineError, SessionError
    from mlxgraph.interpreter.text.tokenizer import TokenizerError

    try:
        program, tokenizer, ids, eos, session, sampler, chat, cache_report = _prepare(args, options)
    except ToolError as e:
        return fail(f"generate: {e}")
    quiet = quiet_unless_first(program)
    reused = cache_report.reused_tokens if cache_report else 0
    on_prefilled = None
    if cache_report is not None:
        from mlxgraph.tools.prompt_cache import save_prompt_cache

        def on_prefilled(s):
            save_prompt_cache(cache_report, s, ids)

    stats = GenerationStats()
    out = sys.stdout
    # Escape control characters only for a terminal (escape sequences must not drive it);
    # a file or a pipe gets the text as it is.
    show = printable if out.isatty() else str
    if not args.json and not chat:
        out.write(show(args.prompt if args.prompt is not None else _echo_ids(tokenizer, ids)))
        out.flush()
    tokens, pieces = [], []
    interrupted = False
    try:
        # eos holds every stop id already (graph, generation_config, --extra-eos-token).
        # A prompt cache already holds ids[:reused]: only the rest is fed.
        for r in stream_generate(
            program,
            ids[reused:],
            max_tokens=args.max_tokens,
            sampler=sampler,
            stop=[*args.stop, *(template_stops(options.source) if chat else ())],
            extra_eos=eos,
            ignore_eos=True,
            tokenizer=tokenizer,
            session=session,
            prefill_chunk=options.session.prefill_chunk,
            stats=stats,
            on_prefilled=on_prefilled,
        ):
            if r.token is not None:
                tokens.append(r.token)
            ids_only = f" {r.token}" if r.token is not None else ""
            piece = r.text if tokenizer is not None else ids_only
            pieces.append(r.text)
            if piece and not args.json:
                out.write(show(piece))
                out.flush()
    except (GraphRuntimeError, SessionError, CacheError, PipelineError) as e:
        if not args.json:
            out.write("\n")
        if not quiet or isinstance(e, PipelineError):  # rank 0 reports what every rank agreed
            print(printable(f"mlxgraph: generate: {e}"), file=sys.stderr)
        return 3
    except (ToolError, TokenizerError) as e:  # the prompt cache, or a token's text
        if not args.json:
            out.write("\n")
        return fail(f"generate: {e}")
    except KeyboardInterrupt:
        # Ctrl-C ends the generation, not the report: the tokens so far and the stats.
        interrupted = True
        stats.stop_reason = "interrupted"
        # Ctrl-C can land between the loop counting a token and this loop receiving it:
        # the report counts what was received (and printed).
        stats.generated_tokens = len(tokens)
    doc = stats_doc(stats, blas, sampler, mx)
    doc["stats"]["compute"] = program.compute_info()
    doc["stats"]["device"] = {"mlx": str(mx.default_device()), "plan": program.device_plan}
    doc["stats"]["quantized"] = quantized_stats(program)
    doc["stats"]["half_matvec"] = half_matvec_stats(program)
    doc["stats"]["native_ops"] = native_ops_stats()
    doc["kv_cache"] = {
        **{k: session.policy[k] for k in ("capacity", "kv_dtype", "kv_bits", "kv_group_size")},
        "capacity_reason": session.capacity_reason,
        "approximations": {str(k): v for k, v in session.approximations.items()},
    }
    doc["prompt_cache"] = cache_report.as_dict() if cache_report else None
    doc["pipeline"] = pipeline_doc(program, mx)
    code = 130 if interrupted else 0
    if quiet:
        return code
    if args.json:
        body = "".join(pieces) if tokenizer is not None else None
        print_json(
            {
                **json_header({"file": program.graph}),
                "graph": str(args.graph),
                "model": args.model,  # the model name given instead of a graph, or None
                "prompt_ids": list(ids),
                "token_ids": tokens,
                "text": body,
                "stop_reason": stats.stop_reason,
                **doc,
            }
        )
        return code
    out.write("\n")
    out.flush()
    print_stats(stats, doc, blas, sys.stderr)
    print_cache_notes(doc, sys.stderr)
    if doc["pipeline"]:
        print_pipeline(doc["pipeline"], sys.stderr)
    source = program.metadata.extra.get("source", "")
    if source.startswith("tiny-") and program.metadata.tokenizer == "byte":
        # The random built-ins are for trying the pipeline: say why their text reads as noise
        # (tiny-code, the trained one, has a real tokenizer and reads like Python).
        print(
            f"model        {source}: seeded random weights, so the text is noise; "
            "export a Hugging Face model folder for real text",
            file=sys.stderr,
        )
    return code


def _echo_ids(tokenizer, ids) -> str:
    if tokenizer is None:
        return " ".join(str(i) for i in ids) + " |"
    return tokenizer.decode(ids)
