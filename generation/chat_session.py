"""A conversation over one KV-cache session: each turn prefills only what is new.

Every turn renders the whole conversation with the chat template (so the ids the model sees
are exactly the full-history template's ids, as transformers' ``apply_chat_template`` gives
them), then keeps the longest prefix the session already holds and feeds only the rest.
Regenerating rewinds the session to before the last answer (``trim``); reset empties it.

Imports mlx: import this only after the BLAS preload (see mlxgraph.interpreter.native.blas).
"""

from mlxgraph.generation.loop import GenerationStats
from mlxgraph.generation.text import stream_generate
from mlxgraph.interpreter.cache.kv_cache import CacheError
from mlxgraph.interpreter.text.tokenizer import TokenizerError


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two id lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class ChatSession:
    """A chat with a graph, keeping one session across turns.

    Args:
        program: the loaded Program; tokenizer: its tokenizer (must have a chat template).
        session: the Session to keep (a fresh one).
        system_prompt: an optional system message starting every conversation.
        generation: stream_generate's keyword arguments for every turn (sampler, stop,
            extra_eos, ignore_eos, max_tokens, prefill_chunk).
    Raises:
        TokenizerError: the tokenizer has no chat template.
    """

    def __init__(self, program, tokenizer, session, system_prompt=None, **generation):
        if tokenizer is None or tokenizer.chat_template is None:
            name = getattr(tokenizer, "name", "no")
            raise TokenizerError(
                f"chat needs a tokenizer with a chat template; the {name} tokenizer has none "
                "(--tokenizer DIR uses another folder's)"
            )
        self.program, self.tokenizer, self.session = program, tokenizer, session
        self.system = (
            [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
        )
        self.generation = generation
        self.messages = list(self.system)
        self.held = []  # the ids whose K/V the session holds, in order

    def send(self, text: str, stats: GenerationStats | None = None):
        """Add a user message and stream the answer (GenerationResponse per token).

        The answer joins the conversation when the stream ends (also when interrupted).
        """
        self.messages.append({"role": "user", "content": text})
        return self._answer(stats, new_message=True)

    def regenerate(self, stats: GenerationStats | None = None):
        """Drop the last answer and stream a new one for the same user message.

        Raises:
            ValueError: there is no answer to regenerate.
        """
        if not self.messages or self.messages[-1]["role"] != "assistant":
            raise ValueError("no answer to regenerate yet")
        self.messages.pop()
        return self._answer(stats)

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays) and empty the session."""
        self.session.reset()
        self.messages, self.held = list(self.system), []

    def _answer(self, stats, new_message: bool = False):
        stats = stats if stats is not None else GenerationStats()
        ids = self.tokenizer.apply_chat_template(self.messages, add_generation_prompt=True)
        # Keep what the session already holds; at least the last prompt token is fed anew
        # (its logits give the first answer token).
        keep = min(common_prefix(self.held, ids), len(ids) - 1)
        try:
            self.session.trim(self.session.length - keep)
        except CacheError:
            # A sliding-window ring cannot rewind that far: start over.
            self.session.reset()
            keep = 0
        self.held = self.held[:keep]
        stats.cached_tokens = keep
        tokens, pieces = [], []
        try:
            for r in stream_generate(
                self.program,
                ids[keep:],
                tokenizer=self.tokenizer,
                session=self.session,
                stats=stats,
                **self.generation,
            ):
                if r.token is not None:
                    tokens.append(r.token)
                pieces.append(r.text)
                yield r
        finally:
            # The session holds a prefix of prompt + answer: whatever was fed before the end.
            self.held = (self.held + ids[keep:] + tokens)[: self.session.length]
            if tokens:
                self.messages.append({"role": "assistant", "content": "".join(pieces)})
            elif new_message:
                # Refused or stopped before any answer: the message is not part of the chat
                # (two user turns in a row would break templates that check alternation).
                self.messages.pop()


__all__ = ["ChatSession", "common_prefix"]
