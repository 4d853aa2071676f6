"""`mlxgraph serve GRAPH.mlxg`: an OpenAI-compatible HTTP server over one graph (docs/serve.md).

Each request gets its own session over the one loaded Program; one scheduler thread runs
them all, interleaved. Needs the ``serve`` extra (starlette, uvicorn).
"""

from mlxgraph.tools.output import ToolError, fail, non_negative_int, positive_float, positive_int
from mlxgraph.tools.text_options import add_element_limit_option

INSTALL_HINT = "needs starlette and uvicorn: pip install 'mlxgraph[serve]'"


def add_arguments(p) -> None:
    """Add serve's arguments to its subparser."""
    p.add_argument("graph", help="the .mlxg graph file")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=non_negative_int, default=8080,
                   help="port (default 8080; 0 picks a free one, printed at start)")
    p.add_argument("--model-id", help="the model name /v1/models lists (default: the file's "
                   "name without .mlxg)")
    p.add_argument("--tokenizer", metavar="DIR", help="use this Hugging Face folder's tokenizer")
    p.add_argument("--max-sessions", type=positive_int, default=16,
                   help="requests generating at once (default 16)")
    p.add_argument("--max-queue", type=non_negative_int, default=64,
                   help="requests waiting for a slot; beyond, 429 (default 64)")
    p.add_argument("--max-tokens", type=positive_int, default=1024,
                   help="the most tokens a request may ask for, and the default (1024)")
    p.add_argument("--capacity", type=positive_int, default=None,
                   help="KV capacity of each request in tokens (default: the graph's context)")
    p.add_argument("--prefill-chunk", type=positive_int, default=256,
                   help="prompt tokens per prefill step, between decode steps (default 256)")
    p.add_argument("--cache-memory", type=non_negative_int, default=1024, metavar="MIB",
                   help="MiB of kept sessions for prefix reuse (default 1024; 0 = off)")
    p.add_argument("--kv-dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="KV cache storage dtype (default: the compute dtype)")
    p.add_argument("--compute-dtype", choices=("float32",), help="widen float16/bfloat16 at load")
    add_element_limit_option(p)
    p.add_argument("--shutdown-timeout", type=positive_int, default=10,
                   help="seconds streams in flight may take after SIGTERM (default 10)")
    p.add_argument("--tokenize-timeout", type=positive_float, default=5.0, metavar="S",
                   help="seconds a request's chat template and tokenization may take "
                   "(default 5)")
    p.add_argument("--log-level", choices=("warning", "info", "debug"), default="info",
                   help="info (default) logs one line per request")


def run(args) -> int:
    """Serve until SIGTERM/SIGINT; returns 0 (SIGTERM), 2 (bad input), 130 (SIGINT)."""
    import importlib.util
    import logging
    from pathlib import Path

    from mlxgraph.interpreter.native.blas import BlasError, preload_blas
    from mlxgraph.tools.file_kind import graph_path_problem

    if any(importlib.util.find_spec(m) is None for m in ("starlette", "uvicorn")):
        return fail(f"serve: {INSTALL_HINT}")
    problem = graph_path_problem(args.graph)
    if problem:
        return fail(f"serve: {problem}")
    if args.tokenizer is not None and not Path(args.tokenizer).is_dir():
        return fail(f"serve: --tokenizer: {args.tokenizer}: not a folder")
    try:
        preload_blas()
    except BlasError as e:
        return fail(f"serve: {e}")
    from mlxgraph.tools.serve.scheduler import Scheduler, ServeOptions
    from mlxgraph.tools.serve.server import bind, serve

    logging.basicConfig(format="mlxgraph serve: %(message)s",
                        level=getattr(logging, args.log_level.upper()))
    options = ServeOptions(
        graph=args.graph, tokenizer=args.tokenizer, compute_dtype=args.compute_dtype,
        kv_dtype=args.kv_dtype, capacity=args.capacity, max_tokens=args.max_tokens,
        max_sessions=args.max_sessions, max_queue=args.max_queue,
        prefill_chunk=args.prefill_chunk, cache_bytes=args.cache_memory << 20)
    scheduler = Scheduler(options)
    try:
        scheduler.start()
    except ToolError as e:
        return fail(f"serve: {e}")
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        scheduler.close()
        return fail(f"serve: cannot listen on {args.host}:{args.port} ({e.strerror or e})")
    model_id = args.model_id or Path(args.graph).name.removesuffix(".mlxg")
    return serve(scheduler, sock, model_id, float(args.shutdown_timeout),
                 tokenize_timeout=args.tokenize_timeout)
