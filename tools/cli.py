"""The `mlxgraph` command: one subcommand per module in mlxgraph.tools.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
Exit codes (EXIT_CODES, the one table the README and docs repeat): 0 success (or
"same"/"valid"), 1 a negative answer (invalid, different, diverged, cannot be exported),
2 bad usage or bad input, 3 the graph failed while running, 130 interrupted (Ctrl-C).
"""

import argparse
import gc
import importlib
import os
import sys

from mlxgraph.interpreter.knobs import KnobError
from mlxgraph.schema.errors import Error
from mlxgraph.tools.output import escaped_output, fail

# Reports that print names read from a graph file: their output escapes control characters
# (a name is data, never a terminal command). `generate` prints model text as it is.
ESCAPED = ("inspect", "diff", "compare", "verify")

# exit code -> meaning, for every command.
EXIT_CODES = {
    0: "success: done, valid, same, no divergence, serve stopped by SIGTERM",
    1: "a negative answer: verify found the file invalid, diff found a difference, compare a "
       "divergence, export a model it cannot export",
    2: "bad usage or bad input: an unknown option, a missing or unreadable file, bad token ids",
    3: "the graph failed while running (generate, chat, compare)",
    130: "interrupted (Ctrl-C)",
}

# subcommand -> (module, one-line help)
COMMANDS = {
    "export": (
        "export_cmd",
        "export a Hugging Face model folder or built-in model to a graph file",
    ),
    "generate": ("generate_cmd", "generate text with a graph file"),
    "chat": ("chat_cmd", "chat with a graph file (its chat template), one session across turns"),
    "serve": ("serve_cmd", "an OpenAI-compatible HTTP server over a graph file, many sessions"),
    "inspect": ("inspect_cmd", "summarise a graph file: metadata, ops, nodes, constants"),
    "verify": ("verify_cmd", "check a graph file (exit 0 valid, 1 invalid)"),
    "diff": ("diff_cmd", "aligned node-stream diff of two graph files (exit 0 same, 1 different)"),
    "compare": ("compare_cmd", "run two graph files and find the first node that diverges"),
    "cache": ("cache_cmd", "inspect a saved KV cache file, or diff two (exit 0 same, 1 different)"),
}


def _load(name: str):
    # Subcommand modules import nothing heavy (mlx, torch) at module level: building the
    # parser imports them all, and `generate` must preload its BLAS before mlx.
    return importlib.import_module(f"mlxgraph.tools.{COMMANDS[name][0]}")


def _version() -> str:
    """The installed package's version (tools do not import the api package)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlxgraph")
    except PackageNotFoundError:
        return "(not installed)"


class UsageError(Error):
    """A command line argparse refuses: reported in one line, exit 2."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog, self.message = prog, message


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors raised (one line from main) instead of usage + exit."""

    def error(self, message):
        raise UsageError(self.prog, message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand (usage errors raise UsageError)."""
    from mlxgraph.schema.format import format_version

    parser = _Parser(
        prog="mlxgraph", description="PyTorch language models as graph files, run on MLX."
    )
    parser.add_argument("--version", action="version",
                        version=f"mlxgraph {_version()} (writes graph format {format_version()})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        _load(name).add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv=None) -> int:
    """Run the command line; returns the exit code (usage errors: one line on stderr, 2)."""
    if argv is None and sys.argv[1:2] == ["export"] and "PYTHONHASHSEED" not in os.environ:
        # Some transformers models (Gemma-3, Llama-4, ...) build nodes in `set` order, which
        # follows the per-process string hash seed: the same export from two runs would
        # differ. A fixed seed makes the file reproducible; re-run before torch is imported,
        # and before the parser is built (its imports took 0.3-0.8 s, paid again after the
        # exec): the new process parses, and reports a bad option, itself.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        os.execve(sys.executable, [sys.executable, "-m", "mlxgraph", *sys.argv[1:]], env)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        where = e.prog.removeprefix("mlxgraph").strip()
        return fail(f"{where}: {e.message}" if where else e.message)
    if not args.command:
        parser.print_help()
        return 2
    try:
        if args.command in ESCAPED:
            with escaped_output():
                return int(_load(args.command).run(args) or 0)
        code = int(_load(args.command).run(args) or 0)
        if argv is None and args.command == "export":
            # The process exits next: its last garbage collection would walk every object
            # the trace made (fx graphs, symbolic shapes) for nothing, 1.3-2.2 s after the
            # file is written (the small Llama). Frozen objects are left to the exit (atexit
            # handlers still run; the memory goes back with the process).
            gc.freeze()
        return code
    except KnobError as e:  # an MLXGRAPH_* variable, bad for any command (docs/knobs.md)
        return fail(f"{args.command}: {e}")
    except KeyboardInterrupt:
        print("\nmlxgraph: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
