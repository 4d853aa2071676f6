"""The options `generate` and `chat` share (tokenizer, chat template, stopping, sampling, cache)
and turning them into a program, tokenizer, sampler and session.

Nothing here imports mlx at module level (the CLI builds its parser before the BLAS
preload); ``open_program`` and ``make_session`` import it.
"""

import math

from mlxgraph.generation.defaults import DEFAULT_MAX_TOKENS, DEFAULT_PREFILL_CHUNK
from mlxgraph.tools.file_kind import graph_path_problem
from mlxgraph.tools.output import (
    ToolError,
    non_negative_float,
    non_negative_int,
    positive_int,
    probability_mass,
)


def add_text_options(p) -> None:
    """Tokenizer, chat template, stopping, sampling and cache options."""
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="use this Hugging Face folder's tokenizer "
        "(tokenizer.json, tokenizer_config.json, generation_config.json) instead of the graph's",
    )
    p.add_argument("--system-prompt", help="a system message before the prompt (chat template)")
    p.add_argument(
        "--ignore-chat-template",
        action="store_true",
        help="encode the prompt as it is, even when the tokenizer has a chat template",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=DEFAULT_MAX_TOKENS,
        help=f"most tokens to generate (default {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop when the text contains TEXT (not printed); repeatable",
    )
    p.add_argument(
        "--extra-eos-token",
        action="append",
        default=[],
        metavar="TOKEN",
        help="one more token (text or id) that ends generation; repeatable",
    )
    p.add_argument(
        "--ignore-eos", action="store_true", help="do not stop at the model's EOS tokens"
    )
    p.add_argument(
        "--temperature",
        "--temp",
        type=non_negative_float,
        default=0.0,
        dest="temperature",
        help="0 = greedy (default); > 0 samples (--temp is mlx-lm's name)",
    )
    p.add_argument(
        "--top-k",
        type=non_negative_int,
        default=0,
        help="sample among the k most likely tokens (0 = off)",
    )
    p.add_argument(
        "--top-p", type=probability_mass, default=1.0, help="nucleus sampling mass (1.0 = off)"
    )
    p.add_argument(
        "--min-p",
        type=float,
        default=0.0,
        help="drop tokens below min-p times the top token's probability (0 = off)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="> 1 discourages the last 20 tokens, as mlx-lm does (1.0 = off)",
    )
    p.add_argument(
        "--seed",
        type=non_negative_int,
        default=None,
        help="random seed for sampling (default: random, reported)",
    )
    p.add_argument(
        "--capacity",
        type=positive_int,
        default=None,
        help="KV cache capacity in tokens (default: the graph's max context)",
    )
    p.add_argument(
        "--prefill-chunk",
        type=positive_int,
        default=DEFAULT_PREFILL_CHUNK,
        help=f"prompt tokens per prefill step (default {DEFAULT_PREFILL_CHUNK})",
    )
    p.add_argument(
        "--kv-dtype",
        choices=("float32", "float16", "bfloat16"),
        default=None,
        help="KV cache storage dtype (default: the compute dtype)",
    )
    p.add_argument(
        "--compute-dtype", choices=("float32",), help="widen float16/bfloat16 at load"
    )
    add_element_limit_option(p)


def add_element_limit_option(p) -> None:
    """--element-limit: raise the per-tensor cost bound a load checks (schema/verify_bounds)."""
    from mlxgraph.tools.output import positive_count

    p.add_argument("--element-limit", type=positive_count, default=None, metavar="N",
                   help="the most elements a tensor of a step may have (default: the file's "
                   "own bound; export names the value a large model needs)")


def check_text_options(args) -> None:
    """Refuse bad values before anything is loaded.

    Raises:
        ToolError: naming the flag.
    """
    checks = (
        (args.max_tokens >= 1, f"--max-tokens must be >= 1, got {args.max_tokens}"),
        (args.prefill_chunk >= 1, f"--prefill-chunk must be >= 1, got {args.prefill_chunk}"),
        (
            args.capacity is None or args.capacity >= 1,
            f"--capacity must be >= 1, got {args.capacity}",
        ),
        (
            math.isfinite(args.temperature) and args.temperature >= 0,
            f"--temperature must be a number >= 0, got {args.temperature}",
        ),
        (args.top_k >= 0, f"--top-k must be >= 0, got {args.top_k}"),
        (0.0 < args.top_p <= 1.0, f"--top-p must be in (0, 1], got {args.top_p}"),
        (0.0 <= args.min_p < 1.0, f"--min-p must be in [0, 1), got {args.min_p}"),
        (
            math.isfinite(args.repetition_penalty) and args.repetition_penalty > 0,
            f"--repetition-penalty must be a number > 0, got {args.repetition_penalty}",
        ),
        (all(args.stop), "--stop: a stop string must not be empty"),
        (
            not (args.system_prompt is not None and args.ignore_chat_template),
            "--system-prompt needs the chat template; drop --ignore-chat-template",
        ),
    )
    for ok, message in checks:
        if not ok:
            raise ToolError(message)
    problem = graph_path_problem(args.graph)
    if problem:
        raise ToolError(problem)
    if args.tokenizer is not None:
        from pathlib import Path

        if not Path(args.tokenizer).is_dir():
            raise ToolError(f"--tokenizer: {args.tokenizer}: not a folder")


def open_program(args, need_tokenizer: bool, deadline: bool = False):
    """(program, tokenizer or None) for the graph and --tokenizer; ``deadline``: a command's
    (tools/command_deadline.py: encode and the chat template in a worker process).

    Raises:
        ToolError: the graph cannot be loaded, or the tokenizer when ``need_tokenizer``.
    """
    from mlxgraph.interpreter.errors import PipelineError
    from mlxgraph.interpreter.program import Program
    from mlxgraph.interpreter.text.tokenizer import TokenizerError, load_tokenizer
    from mlxgraph.schema.errors import GraphFormatError
    from mlxgraph.tools.pipeline_cli import load_options

    try:
        program = Program.load(args.graph, compute_dtype=getattr(args, "compute_dtype", None),
                               element_limit=getattr(args, "element_limit", None),
                               **load_options(args))
    except (GraphFormatError, PipelineError) as e:
        raise ToolError(str(e)) from None
    except OSError as e:
        raise ToolError(f"{args.graph}: cannot read ({e.strerror or e})") from None
    try:
        tokenizer = load_tokenizer(program.metadata, folder=args.tokenizer)
    except TokenizerError as e:
        if need_tokenizer:
            where = "--tokenizer" if args.tokenizer is not None else args.graph
            raise ToolError(f"{where}: {e}") from None
        tokenizer = None
    if deadline:
        from mlxgraph.tools.command_deadline import with_deadline

        tokenizer = with_deadline(tokenizer)
    return program, tokenizer


def make_sampler(args):
    """The Sampler of the sampling flags (a random seed, reported, when none is given).

    Raises:
        ToolError: a bad setting.
    """
    from mlxgraph.generation.sampling import make_sampler as build

    try:
        return build(
            args.temperature, args.top_k, args.top_p, args.min_p, args.repetition_penalty, args.seed
        )
    except ValueError as e:
        raise ToolError(str(e)) from None


def make_session(program, args):
    """A session with --capacity, --kv-dtype, --prefill-chunk, and generate's --window,
    --kv-bits and --kv-group-size.

    Raises:
        ToolError: a setting the graph cannot honour.
    """
    from mlxgraph.interpreter.cache.kv_cache import CacheError
    from mlxgraph.interpreter.errors import SessionError

    windows, window = None, getattr(args, "window", None)
    if window is not None:  # full-attention layers only: a sliding layer's window is its math
        windows = {lid: lc.sliding_window or window for lid, lc in program.layers.items()}
    try:
        return program.session(
            capacity=args.capacity,
            kv_dtype=args.kv_dtype,
            max_step=args.prefill_chunk,
            windows=windows,
            kv_bits=getattr(args, "kv_bits", None) or 0,
            kv_group_size=getattr(args, "kv_group_size", 64),
        )
    except (SessionError, CacheError) as e:
        raise ToolError(f"{args.graph}: {e}") from None


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_PREFILL_CHUNK",
    "add_element_limit_option",
    "add_text_options",
    "check_text_options",
    "make_sampler",
    "make_session",
    "open_program",
]
