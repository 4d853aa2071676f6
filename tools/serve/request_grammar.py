"""A request's grammar (response_format, grammar) compiled into one Constraint per choice,
on the server's tokenizing threads within ``--tokenize-timeout`` (a large schema compiles
off the event loop; llguidance's own limits bound the work). No MLX here."""

import asyncio
import threading

from mlxgraph.generation.constrained import Constraint, ConstraintError, grammar, token_space
from mlxgraph.tools.serve.request_fields import RequestError


class Grammars:
    """Constraints for one model (``info``: the scheduler's ModelInfo; ``tokens``: the
    RequestTokens whose threads compile them)."""

    def __init__(self, info, tokens):
        self.info, self.tokens = info, tokens
        self._space, self._lock = None, threading.Lock()

    async def constraints(self, req, count: int) -> list:
        """``count`` Constraints of the request's grammar (Nones when it has none).
        Raises RequestError: 400 naming the field when the grammar does not compile."""
        if req.constraint is None:
            return [None] * count
        tokens = self.tokens
        field = "tools" if req.tool_choice not in ("none", "auto") else (
            "grammar" if req.constraint[0] == "gbnf" else "response_format")
        work = asyncio.get_running_loop().run_in_executor(tokens.pool, self._compile,
                                                          req.constraint, count, field)
        try:
            return await asyncio.wait_for(work, tokens.timeout + 2.0)
        except asyncio.TimeoutError:
            raise RequestError(f"compiling the grammar took more than {tokens.timeout:g} s",
                               status=503, kind="server_error") from None

    def _compile(self, constraint, count, field) -> list:
        try:
            with self._lock:  # made once: llguidance decodes every token of the vocabulary
                if self._space is None:
                    info = self.info
                    self._space = token_space(info.tokenizer, info.vocab_size, info.stop_ids)
            text = grammar(*constraint)
            return [Constraint(self._space, text) for _ in range(count)]
        except ConstraintError as e:
            raise RequestError(f"'{field}': {e}", field) from None


__all__ = ["Grammars"]
