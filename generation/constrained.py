"""Constrained decoding: the tokens a grammar allows next, as a mask the Sampler applies.

The grammar (a JSON schema, any JSON object, a Lark or GBNF grammar, a regex) is compiled
and followed by llguidance (MIT; Microsoft's library behind guidance and several
servers' structured output): it computes each step's allowed tokens from the tokens so
far, without precompiling an automaton over the vocabulary (outlines-core's approach, whose
index grows with schema and vocabulary), and bounds its own work per step (its parser
limits), so a stranger's grammar costs bounded time. A token outside the mask cannot be
chosen, so a generation that ends by the grammar (not by ``max_tokens``) matches it.
No mlx import: the mask is a numpy array (the server builds constraints off its MLX
thread).
"""

import json

import llguidance
import numpy as np
from llguidance.gbnf_to_lark import gbnf_to_lark
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from mlxgraph.schema.errors import Error

KINDS = ("json_object", "json_schema", "lark", "gbnf", "regex")


class ConstraintError(Error, ValueError):
    """A grammar llguidance refuses (its own message), or a tokenizer it cannot follow."""


def token_space(tokenizer, vocab: int, eos_ids) -> "llguidance.LLTokenizer":
    """llguidance's view of ``tokenizer`` over a model vocabulary of ``vocab`` ids, ending
    at ``eos_ids``: made once per tokenizer (it decodes every token).

    Raises:
        ConstraintError: a tokenizer that is neither a Hugging Face one nor bytes.
    """
    eos = [int(t) for t in eos_ids]
    if not eos:
        raise ConstraintError("constrained decoding needs an EOS token to end on")
    files = getattr(tokenizer, "files", None)
    try:
        if files is not None and "tokenizer.json" in files:
            return llguidance.LLTokenizer(files["tokenizer.json"], n_vocab=vocab,
                                          eos_token=eos)
        if getattr(tokenizer, "name", None) == "byte":
            return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes(tokenizer, eos)),
                                          n_vocab=vocab, eos_token=eos)
    except Exception as e:  # noqa: BLE001 - the library's own error, in one line
        raise ConstraintError(f"llguidance cannot follow this tokenizer: {e}") from None
    raise ConstraintError("constrained decoding needs the model's tokenizer")


def grammar(kind: str, value) -> str:
    """llguidance's grammar of ``kind`` (KINDS) and its ``value`` (the schema dict; the
    grammar's or regex's text; None for json_object).

    Raises:
        ConstraintError: the grammar does not compile (llguidance's message).
    """
    matcher = llguidance.LLMatcher
    try:
        # compact JSON: free whitespace would let a model pad without end
        if kind in ("json_object", "json_schema"):
            schema = {"type": "object"} if kind == "json_object" else value
            text = matcher.grammar_from_json_schema(json.dumps(schema),
                                                    overrides={"whitespace_flexible": False})
        elif kind == "lark":
            text = matcher.grammar_from_lark(value)
        elif kind == "gbnf":
            text = matcher.grammar_from_lark(gbnf_to_lark(value))
        else:
            text = matcher.grammar_from_regex(value)
        failed, messages = matcher.validate_grammar_with_warnings(text)
        message = messages[0] if failed else ""
    except Exception as e:  # noqa: BLE001 - the library's own error, in one line
        failed, message = True, str(e)
    if failed:
        raise ConstraintError(" ".join(str(message).split())[:500])
    return text


class Constraint:
    """One generation's grammar state.

    Args:
        space: token_space()'s tokenizer; grammar_text: grammar()'s text.
    """

    def __init__(self, space, grammar_text: str):
        self._matcher = llguidance.LLMatcher(space, grammar_text)
        if self._matcher.is_error():
            raise ConstraintError(self._matcher.get_error())
        self._vocab = space.vocab_size
        self._bits = allocate_token_bitmask(1, self._vocab)

    def allowed(self) -> np.ndarray:
        """[vocab] bool: the tokens the grammar allows next."""
        fill_next_token_bitmask(self._matcher, self._bits, 0)
        bits = np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")
        return bits[: self._vocab].astype(np.bool_)

    def consume(self, token: int) -> None:
        """Advance past ``token``. Raises ConstraintError: the grammar does not allow it."""
        if not self._matcher.consume_token(int(token)):
            raise ConstraintError(f"token {token} does not follow the grammar: "
                                  f"{self._matcher.get_error()}")


class _Bytes:
    """A byte tokenizer as llguidance's TokenizerWrapper reads one."""

    def __init__(self, tok, eos):
        self.eos_token_id, self.bos_token_id = eos[0], tok.bos if tok.bos >= 0 else None
        self.tokens = [b"" if i in tok.specials else bytes([i]) for i in range(256)]
        self.special_token_ids = sorted(tok.specials | set(eos))
        self._tok = tok

    def __call__(self, text) -> list:
        raw = text if isinstance(text, bytes) else text.encode("utf-8")
        return list(raw)


__all__ = ["KINDS", "Constraint", "ConstraintError", "grammar", "token_space"]
