"""A request's prompt as token ids: the chat template rendered and the text encoded, off
the event loop, within a deadline.

Four threads of their own do it (``TOKENIZE_THREADS``), so a slow request never takes the
event loop's thread pool; each call must finish within ``--tokenize-timeout`` (waiting for
a thread included: past it, 503 with ``Retry-After``). A graph's Hugging Face tokenizer
runs in worker processes, one per thread (tools/tokenize_process.py), killed past the
deadline; the chat template renders there under its own deadline (TemplateLimits). No
MLX here.
"""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from mlxgraph.interpreter.text.chat_template import TemplateLimits
from mlxgraph.interpreter.text.tokenizer import TokenizerError
from mlxgraph.tools.serve.openai_requests import RequestError
from mlxgraph.tools.tokenize_process import TokenizerPool

TOKENIZE_THREADS = 4  # requests rendered and tokenized at once; more wait for a thread


def tokenize(info, req, limits=None, tok=None) -> list:
    """Each prompt's token ids, a list (chat: one, the chat template applied under
    ``limits`` with the request's chat_template_kwargs).

    Raises:
        RequestError: 400 for a prompt or conversation the tokenizer or its chat template
            refuses (a template that fails or passes its limits included).
    """
    tok = info.tokenizer if tok is None else tok
    if req.kind == "chat":
        if tok is None or tok.chat_template is None:
            raise RequestError("this model's tokenizer has no chat template; "
                               "use /v1/completions", "messages")
        return [_checked(info, "messages", lambda: tok.apply_chat_template(
            req.messages, add_generation_prompt=True, limits=limits, **req.template_kwargs))]
    out = []
    for prompt in req.prompts:
        if isinstance(prompt, list):
            out.append(_checked(info, "prompt", lambda p=prompt: p))
        elif tok is None:
            raise RequestError("this model carries no tokenizer: send token ids", "prompt")
        else:
            out.append(_checked(info, "prompt", lambda p=prompt: tok.encode(p)))
    return out


def _checked(info, where, encode) -> list:
    """``encode()``'s ids, checked against the vocabulary and the context."""
    try:
        ids = encode()
    except TokenizerError as e:
        raise RequestError(str(e), where) from None
    if not ids:
        raise RequestError("the prompt encodes to no tokens", where)
    bad = [t for t in ids if not 0 <= t < info.vocab_size]
    if bad:
        raise RequestError(f"token id {bad[0]} is outside the vocabulary [0, "
                           f"{info.vocab_size})", where)
    if len(ids) > info.capacity:
        raise RequestError(f"the prompt has {len(ids)} tokens, more than the context of "
                           f"{info.capacity}", where, code="context_length_exceeded")
    return ids


class RequestTokens:
    """Token ids of requests for one model (``info``: the scheduler's ModelInfo)."""

    def __init__(self, info, timeout: float):
        self.info, self.timeout = info, float(timeout)
        self.pool = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="mlxgraph-tokenize")
        tok = info.tokenizer
        self.processes = None if getattr(tok, "files", None) is None else TokenizerPool(
            tok, TOKENIZE_THREADS, self.timeout + 0.5)
        if self.processes is not None:  # started now, so the first requests do not wait
            threading.Thread(target=self.processes.warm, daemon=True).start()

    async def ids(self, req) -> list:
        """Each prompt's ids (tokenize's list). Raises RequestError: 400 (refused, or past
        the deadline in a worker), 503 (no thread was free within the deadline)."""
        limits = TemplateLimits(seconds=self.timeout)
        work = asyncio.get_running_loop().run_in_executor(self.pool, self._here, req, limits)
        try:
            return await asyncio.wait_for(work, self.timeout + 2.0)
        except asyncio.TimeoutError:
            raise RequestError(f"tokenizing the request took more than {self.timeout:g} s "
                               "(the server is busy)", status=503, kind="server_error") from None

    async def decode(self, ids, field: str) -> str:
        """The text of ``ids`` (the server's own tokenizer, on these threads). Raises
        RequestError: 400 naming ``field`` when the tokenizer refuses, 503 past the
        deadline."""
        work = asyncio.get_running_loop().run_in_executor(self.pool, _decode,
                                                          self.info.tokenizer, ids, field)
        try:
            return await asyncio.wait_for(work, self.timeout + 2.0)
        except asyncio.TimeoutError:
            raise RequestError(f"decoding took more than {self.timeout:g} s (the server is "
                               "busy)", status=503, kind="server_error") from None

    def _here(self, req, limits) -> list:
        if self.processes is None:
            return tokenize(self.info, req, limits)
        with self.processes.borrow() as tok:
            # --chat-template: the chosen template over the worker's tokenizer
            rewrap = getattr(self.info.tokenizer, "with_inner", None)
            return tokenize(self.info, req, limits, rewrap(tok) if rewrap else tok)

    def close(self) -> None:
        """Stop the threads' queue and kill the worker processes."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.processes is not None:
            self.processes.close()


def _decode(tok, ids, field) -> str:
    try:
        return tok.decode(ids)
    except TokenizerError as e:
        raise RequestError(str(e), field) from None


__all__ = ["TOKENIZE_THREADS", "RequestTokens", "tokenize"]
