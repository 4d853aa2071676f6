"""`mlxgraph chat GRAPH.mlxg`: a conversation in the terminal, one KV-cache session throughout.

Each line typed is a user message; the answer streams back, then one stats line on stderr
saying how many tokens were prefilled and how many came from the session's history. Lines
starting with ``/`` are commands: ``/regenerate`` (a new answer to the last message: the
session is trimmed to before it), ``/reset`` (a new conversation), ``/quit``. Ctrl-C stops
an answer; Ctrl-D (end of input) ends the chat.
"""

import sys

from mlxgraph.tools.option_table import add_options
from mlxgraph.tools.output import ToolError, fail, printable
from mlxgraph.tools.text_options import open_session, template_stops, text_options

HELP = "commands: /regenerate  /reset  /quit  (Ctrl-C stops an answer, Ctrl-D quits)"


def add_arguments(p) -> None:
    """Add chat's arguments to its subparser."""
    p.add_argument("graph", help="the .mlxg graph file, or a model (a Hugging Face folder, Hub "
                   "repo id or built-in name, exported once into the graph cache); its "
                   "tokenizer's chat template is used, or --chat-template's")
    add_options(p, "chat")


def run(args) -> int:
    """Chat until end of input; returns the exit code (0, 2 bad input, 3 the graph failed)."""
    from mlxgraph.interpreter.native.blas import BlasError, preload_blas
    from mlxgraph.tools.model_graphs import ModelGraphError

    try:
        options = text_options(args)
        preload_blas()
    except (ToolError, BlasError) as e:
        return fail(f"chat: {e}")
    except ModelGraphError as e:
        return e.code
    from mlxgraph.generation.chat_session import ChatSession
    from mlxgraph.generation.sampling import make_sampler
    from mlxgraph.generation.text import stop_ids
    from mlxgraph.interpreter.text.tokenizer import TokenizerError

    try:
        program, tokenizer = options.source.open(need_tokenizer=True, deadline=True)
        eos = stop_ids(program, tokenizer, args.extra_eos_token, args.ignore_eos)
        chat = ChatSession(
            program,
            tokenizer,
            open_session(program, options.session, args.graph),
            args.system_prompt,
            sampler=make_sampler(options.sampling),
            stop=[*args.stop, *template_stops(options.source)],
            extra_eos=eos,
            ignore_eos=True,
            max_tokens=args.max_tokens,
            prefill_chunk=options.session.prefill_chunk,
        )
    except (ToolError, TokenizerError) as e:
        return fail(f"chat: {e}")
    from mlxgraph.tools.generate_report import approximation_lines

    for line in approximation_lines(chat.session.approximations):
        print(line, file=sys.stderr)
    interactive = sys.stdin.isatty()
    if interactive:
        print(HELP, file=sys.stderr)
    return _loop(chat, interactive)


def _loop(chat, interactive: bool) -> int:
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            return 0
        except KeyboardInterrupt:
            print(file=sys.stderr)
            continue
        command = line.strip()
        if not command:
            continue
        if command in ("/quit", "/exit"):
            return 0
        if command == "/reset":
            chat.reset()
            print("(new conversation)", file=sys.stderr)
            continue
        try:
            turn = chat.stream_regenerate() if command == "/regenerate" else chat.stream(line)
        except ValueError as e:
            print(f"({e})", file=sys.stderr)
            continue
        code = _stream(turn)
        turn.close()  # one stopped by Ctrl-C between two pieces frees the chat now
        if code:
            return code


def _stream(turn) -> int:
    """Print one answer and its stats line; returns 0, or 3 when the graph failed."""
    from mlxgraph.interpreter.cache.kv_cache import CacheError
    from mlxgraph.interpreter.errors import GraphRuntimeError, SessionError
    from mlxgraph.interpreter.text.tokenizer import TokenizerError

    out = sys.stdout
    show = printable if out.isatty() else str
    stats, reason = None, "interrupted"
    try:
        for r in turn:
            stats = r.stats
            if r.text:
                out.write(show(r.text))
                out.flush()
            reason = r.stop_reason or reason
    except KeyboardInterrupt:
        reason = "interrupted"
    except (TokenizerError, ValueError) as e:
        print(f"\nmlxgraph: chat: {e}", file=sys.stderr)
        return 0
    except (GraphRuntimeError, SessionError, CacheError) as e:
        print(f"\nmlxgraph: chat: {e}", file=sys.stderr)
        return 3
    finally:
        turn.close()  # the answer so far joins the conversation now, even when interrupted
    out.write("\n")
    out.flush()
    if stats is not None:
        print(
            f"[prefilled {stats.prompt_tokens} new tokens "
            f"({stats.cached_tokens} from the session), {stats.prefill_tps:.1f} tok/s; "
            f"generated {stats.generated_tokens}, {stats.decode_tps:.1f} tok/s; "
            f"stopped: {reason.replace('_', ' ')}]",
            file=sys.stderr,
        )
    return 0
