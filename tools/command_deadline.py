"""A command's tokenizer with a deadline: ``encode`` and ``apply_chat_template`` in a
worker process (tools/tokenize_process.py), killed past MLXGRAPH_TOKENIZER_DEADLINE
seconds (60 by default): one TokenizerError line, exit 2.

A graph's tokenizer may carry a regex that Oniguruma runs slowly without ever reaching its
backtracking limit, and while the tokenizers library runs, no Python thread runs (it holds
the GIL), so only another process can stop it: a tokenizer whose file has a Regex pattern
(a Split, a Replace) gets a worker, started as soon as the tokenizer is loaded (about 0.3 s
before its first answer); one without, or a byte-level tokenizer, is used as it is;
``mlxgraph serve`` keeps a pool of such workers (tools/serve/request_tokens.py); the
Python API has no deadline.
"""

from mlxgraph.interpreter.knobs import TOKENIZER_DEADLINE
from mlxgraph.tools.tokenize_process import TokenizerProcess


class DeadlinedTokenizer:
    """``tokenizer`` whose ``encode`` and ``apply_chat_template`` run in a worker process
    with a deadline; every other attribute is the tokenizer's own (decoding stays here: a
    decoder has no regex, interpreter/text/tokenizer_check.py)."""

    def __init__(self, tokenizer, seconds: float | None = None):
        self._tok = tokenizer
        self._worker = TokenizerProcess(tokenizer, seconds or TOKENIZER_DEADLINE.read())
        self._worker.start()

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def encode(self, *args, **kwargs):
        return self._worker.encode(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        return self._worker.apply_chat_template(*args, **kwargs)


def with_deadline(tokenizer, seconds: float | None = None):
    """A Hugging Face tokenizer whose file brings its own regex, with a deadline (``seconds``,
    default MLXGRAPH_TOKENIZER_DEADLINE); any other as it is (its time is bounded by its
    input: interpreter/text/tokenizer_check.py)."""
    bounds = getattr(tokenizer, "bounds", None)
    return DeadlinedTokenizer(tokenizer, seconds) if bounds is not None and bounds.regex \
        else tokenizer


__all__ = ["DeadlinedTokenizer", "with_deadline"]
