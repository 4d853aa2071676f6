"""A conversation over one KV-cache session: each turn prefills only what is new.

Every turn renders the whole conversation with the chat template (so the ids the model sees
are exactly the full-history template's ids, as transformers' ``apply_chat_template`` gives
them), then keeps the longest prefix the session already holds and feeds only the rest.
Regenerating rewinds the session to before the last answer (``trim``); reset empties it.
One turn at a time: a call while an answer is still streaming (started and neither finished
nor closed) is refused with ChatBusyError, since its history would interleave.

Imports mlx: import this only after the BLAS preload (see mlxgraph.interpreter.native.blas).
"""

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mlxgraph.generation.loop import GenerationStats
from mlxgraph.generation.text import GenerationResponse, stream_generate
from mlxgraph.interpreter.cache.kv_cache import CacheError
from mlxgraph.interpreter.text.tokenizer import TokenizerError
from mlxgraph.schema.errors import Error

if TYPE_CHECKING:  # annotations only
    from mlxgraph.interpreter.program import Program
    from mlxgraph.interpreter.session.session import Session


class ChatBusyError(Error, RuntimeError):
    """A ChatSession call while one of its answers is still streaming."""


BUSY = ("an answer of this ChatSession is still streaming: finish it or close() it before the "
        "next call")


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

    def __init__(self, program: "Program", tokenizer: Any, session: "Session",
                 system_prompt: str | None = None, **generation: Any):
        if tokenizer is None or tokenizer.chat_template is None:
            name = getattr(tokenizer, "name", "no")
            raise TokenizerError(
                f"chat needs a chat template; the {name} tokenizer has none (--chat-template "
                "plain or chatml chats without one; --tokenizer DIR uses another folder's)"
            )
        self.program, self.tokenizer, self.session = program, tokenizer, session
        self.system = (
            [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
        )
        self.generation = generation
        self.messages = list(self.system)
        self.held = []  # the ids whose K/V the session holds, in order
        self._busy = threading.Lock()  # held while an answer streams

    def send(self, text: str, stats: GenerationStats | None = None) -> str:
        """Add a user message and return the whole answer (its text).

        Raises:
            ChatBusyError: an answer is still streaming; the errors of :meth:`stream`.
        """
        return "".join(r.text for r in self.stream(text, stats))

    def stream(self, text: str, stats: GenerationStats | None = None
               ) -> Iterator[GenerationResponse]:
        """Add a user message and stream the answer (a GenerationResponse per token).

        Nothing happens until the first piece is asked for; the message and the answer
        join the conversation when the stream ends (also when interrupted or closed).

        Raises:
            ChatBusyError: another answer is still streaming (finish or close() it first).
        """
        self._refuse_if_busy()
        return self._answer(stats, message={"role": "user", "content": text})

    def regenerate(self, stats: GenerationStats | None = None) -> str:
        """Drop the last answer and return a new one for the same user message.

        Raises:
            ValueError: there is no answer to regenerate. ChatBusyError: as :meth:`send`.
        """
        return "".join(r.text for r in self.stream_regenerate(stats))

    def stream_regenerate(self, stats: GenerationStats | None = None
                          ) -> Iterator[GenerationResponse]:
        """:meth:`regenerate`, streamed as :meth:`stream` streams.

        Raises:
            ValueError: there is no answer to regenerate. ChatBusyError: as :meth:`stream`.
        """
        self._refuse_if_busy()
        if not self.messages or self.messages[-1]["role"] != "assistant":
            raise ValueError("no answer to regenerate yet")
        return self._answer(stats, regenerate=True)

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays) and empty the session.

        Raises:
            ChatBusyError: an answer is still streaming.
        """
        self._refuse_if_busy()
        self.session.reset()
        self.messages, self.held = list(self.system), []

    def _refuse_if_busy(self) -> None:
        if self._busy.locked():
            raise ChatBusyError(BUSY)

    def _answer(self, stats, message=None, regenerate=False):
        if not self._busy.acquire(blocking=False):  # another stream began since this was made
            raise ChatBusyError(BUSY)
        try:
            if regenerate:
                self.messages.pop()
            if message is not None:
                self.messages.append(message)
            yield from self._turn(stats, new_message=message is not None)
        finally:
            self._busy.release()

    def _turn(self, stats, new_message: bool):
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


__all__ = ["ChatBusyError", "ChatSession", "common_prefix"]
