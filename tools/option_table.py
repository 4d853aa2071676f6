"""The text options of `generate`, `chat` and `serve`, declared once.

Each option is one row: its flags, the commands that take it, its one default and, only
where a command's use differs, that command's own default and help (both in the same row,
with the reason beside it). ``add_options(parser, command)`` adds a command's rows;
tools/text_options.py turns the parsed values into the library's typed options.

Nothing here imports mlx (the CLI builds its parser before the BLAS preload).
"""

from dataclasses import dataclass, field

from mlxgraph.generation.defaults import DEFAULT_MAX_TOKENS, DEFAULT_PREFILL_CHUNK
from mlxgraph.generation.options import (
    DEFAULT_KV_GROUP_SIZE,
    KV_BITS,
    KV_DTYPES,
    KV_GROUP_SIZES,
)
from mlxgraph.tools.output import (
    non_negative_float,
    non_negative_int,
    positive_count,
    positive_int,
    probability_mass,
)

TEXT = ("generate", "chat")
ALL = ("generate", "chat", "serve")

# serve: --max-tokens is the most a request may ask for (and what it gets when it asks for
# nothing): an API client expects a whole answer, not generate's short default.
SERVE_MAX_TOKENS = 1024
# serve: --prefill-chunk is also about the most prompt tokens one scheduler round prefills,
# and every decoding stream waits for that round (docs/serve.md, "Many requests"): a smaller
# chunk bounds the other streams' inter-token latency; generate has no one else to wait.
SERVE_PREFILL_CHUNK = 256
# serve: the sampling flags are server-wide defaults, each used by a request that does not
# give the field (tools/serve/openai_requests.py); unset, a request gets OpenAI's defaults.
# The filters (top-k, top-p, min-p) apply to sampled requests only, never to a greedy one.
SERVE_DEFAULT = "the {field} of a sampled request that gives none (default: off)"
SERVE_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "seed")


@dataclass(frozen=True)
class Option:
    """One flag: ``flags`` (the first names ``args``), ``help`` (``{default}`` is filled in),
    the commands that take it, its default, a command's own default or help where its use
    differs, and argparse's other keywords (type, choices, action, metavar, dest)."""

    flags: tuple
    help: str
    commands: tuple = ALL
    default: object = None
    defaults: dict = field(default_factory=dict)
    helps: dict = field(default_factory=dict)
    argparse: dict = field(default_factory=dict)

    def default_for(self, command: str):
        """The default this command's parser gets."""
        return self.defaults.get(command, self.default)


OPTIONS = (
    Option(("--tokenizer",), "use this Hugging Face folder's tokenizer (tokenizer.json, "
           "tokenizer_config.json, generation_config.json) instead of the graph's",
           argparse={"metavar": "DIR"}),
    Option(("--chat-template",), "the chat template to use instead of (or where there is "
           "none in) the tokenizer's: chatml, plain (a User:/Assistant: transcript, for base "
           "models) or a jinja2 file; its turn-ending stop strings come with it", ALL,
           argparse={"metavar": "NAME|FILE"}),
    Option(("--system-prompt",), "a system message before the prompt (chat template)", TEXT),
    Option(("--ignore-chat-template",), "encode the prompt as it is, even when the tokenizer "
           "has a chat template", ("generate",), False, argparse={"action": "store_true"}),
    Option(("--max-tokens",), "most tokens to generate (default {default})", ALL,
           DEFAULT_MAX_TOKENS, defaults={"serve": SERVE_MAX_TOKENS},
           helps={"serve": "the most tokens a request may ask for, and the default ({default})"},
           argparse={"type": positive_int}),
    Option(("--stop",), "stop when the text contains TEXT (not printed); repeatable", TEXT,
           [], argparse={"action": "append", "metavar": "TEXT"}),
    Option(("--extra-eos-token",), "one more token (text or id) that ends generation; "
           "repeatable", TEXT, [], argparse={"action": "append", "metavar": "TOKEN"}),
    Option(("--ignore-eos",), "do not stop at the model's EOS tokens", TEXT, False,
           argparse={"action": "store_true"}),
    Option(("--temperature", "--temp"), "0 = greedy (default); > 0 samples (--temp is "
           "mlx-lm's name)", ALL, 0.0, defaults={"serve": None},
           helps={"serve": "the temperature of a request that gives none (default: OpenAI's "
                  "1.0; 0 = greedy)"}, argparse={"type": non_negative_float}),
    Option(("--top-k",), "sample among the k most likely tokens (0 = off)", ALL, 0,
           defaults={"serve": None}, helps={"serve": SERVE_DEFAULT.format(field="top_k")},
           argparse={"type": non_negative_int}),
    Option(("--top-p",), "nucleus sampling mass (1.0 = off)", ALL, 1.0,
           defaults={"serve": None}, helps={"serve": SERVE_DEFAULT.format(field="top_p")},
           argparse={"type": probability_mass}),
    Option(("--min-p",), "drop tokens below min-p times the top token's probability (0 = off)",
           ALL, 0.0, defaults={"serve": None},
           helps={"serve": SERVE_DEFAULT.format(field="min_p")}, argparse={"type": float}),
    Option(("--repetition-penalty",), "> 1 discourages the last 20 tokens, as mlx-lm does "
           "(1.0 = off)", TEXT, 1.0, argparse={"type": float}),
    Option(("--seed",), "random seed for sampling (default: random, reported)", ALL,
           helps={"serve": "the seed of a request that gives none (default: a random one per "
                  "request)"}, argparse={"type": non_negative_int}),
    Option(("--capacity",), "KV cache capacity in tokens (default: the model's own maximum "
           "context, bounded by memory; the stats say which)",
           helps={"serve": "KV capacity of each request in tokens (default: the model's own "
                  "maximum context, bounded by memory; said at start)"},
           argparse={"type": positive_int}),
    Option(("--prefill-chunk",), "prompt tokens per prefill step (default {default})", ALL,
           DEFAULT_PREFILL_CHUNK, defaults={"serve": SERVE_PREFILL_CHUNK},
           helps={"serve": "prompt tokens per prefill step, between decode steps "
                  "(default {default})"}, argparse={"type": positive_int}),
    Option(("--kv-dtype",), "KV cache storage dtype (default: the compute dtype)",
           argparse={"choices": KV_DTYPES}),
    Option(("--kv-bits",), "store the KV cache quantized to 4 or 8 bits (group-wise affine; "
           "default: floats)", argparse={"type": int, "choices": KV_BITS}),
    Option(("--kv-group-size",), "elements per quantization group of --kv-bits "
           "(default {default})", ALL, DEFAULT_KV_GROUP_SIZE,
           argparse={"type": int, "choices": KV_GROUP_SIZES}),
    Option(("--window",), "keep only the last N tokens on full-attention layers (an "
           "approximation of the model, reported; sliding-window layers keep their own window)",
           argparse={"type": positive_int, "metavar": "N"}),
    Option(("--compute-dtype",), "widen float16/bfloat16 at load",
           argparse={"choices": ("float32",)}),
    Option(("--int8-activations",), "round activations to int8 in q8/q4 products, as "
           "llama.cpp does (faster with AVX-512 VNNI; default: exact float32; "
           "docs/precision.md)", argparse={"action": "store_true"}),
    Option(("--element-limit",), "the most elements a tensor of a step may have (default: the "
           "file's own bound; export names the value a large model needs)",
           argparse={"type": positive_count, "metavar": "N"}),
)


def add_options(p, command: str) -> None:
    """Add the rows ``command`` takes to its parser."""
    for option in OPTIONS:
        if command not in option.commands:
            continue
        default = option.default_for(command)
        text = option.helps.get(command, option.help).format(default=default)
        p.add_argument(*option.flags, **{"default": default, "help": text, **option.argparse})


__all__ = [
    "OPTIONS",
    "SERVE_MAX_TOKENS",
    "SERVE_PREFILL_CHUNK",
    "SERVE_SAMPLING",
    "Option",
    "add_options",
]
