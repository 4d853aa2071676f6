"""`mlxgraph serve GRAPH.mlxg`: an OpenAI-compatible HTTP server over one graph (docs/serve.md).

Each request gets its own session over the one loaded Program; one scheduler thread runs
them all, interleaved. Needs the ``serve`` extra (starlette, uvicorn).
"""

from mlxgraph.tools.option_table import SERVE_SAMPLING, add_options
from mlxgraph.tools.output import ToolError, fail, non_negative_int, positive_float, positive_int
from mlxgraph.tools.serve.options import ServeOptions

INSTALL_HINT = "needs starlette and uvicorn: pip install 'mlxgraph[serve]'"


def add_arguments(p) -> None:
    """Add serve's arguments to its subparser."""
    p.add_argument("graph", help="the .mlxg graph file, or a model: a Hugging Face folder, "
                   "Hub repo id or built-in name, exported once into the graph cache")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=non_negative_int, default=8080,
                   help="port (default 8080; 0 picks a free one, printed at start)")
    p.add_argument("--model-id", help="the model name /v1/models lists (default: the file's "
                   "name without .mlxg)")
    p.add_argument("--max-sessions", type=positive_int, default=ServeOptions.max_sessions,
                   help=f"requests generating at once (default {ServeOptions.max_sessions})")
    p.add_argument("--max-queue", type=non_negative_int, default=ServeOptions.max_queue,
                   help=f"requests waiting for a slot; beyond, 429 (default "
                   f"{ServeOptions.max_queue})")
    p.add_argument("--cache-memory", type=non_negative_int, default=ServeOptions.cache_bytes >> 20,
                   metavar="MIB", help=f"MiB of kept sessions for prefix reuse (default "
                   f"{ServeOptions.cache_bytes >> 20}; 0 = off)")
    add_options(p, "serve")
    p.add_argument("--shutdown-timeout", type=positive_int, default=10,
                   help="seconds streams in flight may take after SIGTERM (default 10)")
    p.add_argument("--tokenize-timeout", type=positive_float, default=5.0, metavar="S",
                   help="seconds a request's chat template and tokenization may take "
                   "(default 5)")
    p.add_argument("--log-level", choices=("warning", "info", "debug"), default="info",
                   help="info (default) logs one line per request")


def serve_options(args):
    """The server's options from its flags, checked before anything is loaded.

    Raises:
        ToolError: naming the flag, or a graph path or --tokenizer folder that is not one.
    """
    from mlxgraph.tools.model_graphs import use_model_graph
    from mlxgraph.tools.text_options import GraphSource, sampling_defaults, session_options

    session = session_options(args)
    sampling = sampling_defaults(args, SERVE_SAMPLING)
    use_model_graph(args)  # (a model folder, repo id or built-in: its cached graph)
    source = GraphSource.of(args)
    source.check()
    return ServeOptions(source, session, max_tokens=args.max_tokens,
                        max_sessions=args.max_sessions, max_queue=args.max_queue,
                        cache_bytes=args.cache_memory << 20, sampling=sampling)


def run(args) -> int:
    """Serve until SIGTERM/SIGINT; returns 0 (SIGTERM), 2 (bad input), 130 (SIGINT)."""
    import importlib.util
    import logging
    import sys

    from mlxgraph.interpreter.native.blas import BlasError, preload_blas
    from mlxgraph.tools.model_graphs import ModelGraphError
    from mlxgraph.tools.model_graphs import model_id as graph_model_id

    if any(importlib.util.find_spec(m) is None for m in ("starlette", "uvicorn")):
        return fail(f"serve: {INSTALL_HINT}")
    try:
        options = serve_options(args)
        preload_blas()
    except (ToolError, BlasError) as e:
        return fail(f"serve: {e}")
    except ModelGraphError as e:
        return e.code
    from mlxgraph.tools.generate_report import approximation_lines
    from mlxgraph.tools.serve.scheduler import Scheduler
    from mlxgraph.tools.serve.server import bind, serve

    logging.basicConfig(format="mlxgraph serve: %(message)s",
                        level=getattr(logging, args.log_level.upper()))
    scheduler = Scheduler(options)
    try:
        info = scheduler.start()
    except ToolError as e:
        return fail(f"serve: {e}")
    for line in approximation_lines(info.approximations):
        print(f"mlxgraph serve: {line}", file=sys.stderr, flush=True)
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        scheduler.close()
        return fail(f"serve: cannot listen on {args.host}:{args.port} ({e.strerror or e})")
    model_id = args.model_id or graph_model_id(args)
    return serve(scheduler, sock, model_id, float(args.shutdown_timeout),
                 tokenize_timeout=args.tokenize_timeout)
