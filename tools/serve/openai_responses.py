"""OpenAI response bodies: completions and chat completions, whole or as stream chunks, with
``usage``, ``finish_reason`` and log-probabilities in OpenAI's two layouts, built through the
models of response_models.py. No mlx import.

Log-probabilities are those of the model's own distribution (log-softmax of the logits,
before temperature, top-k/top-p/min-p or the repetition penalty), as ``logprobs`` reports
them in OpenAI's API.
"""

import time
import uuid

from mlxgraph.tools.serve import response_models as m


class ResponseBuilder:
    """Builds the documents of one request.

    Args:
        kind: "completion" or "chat".
        model: the model id answered with.
        token_text: ``fn(token id) -> str``, the text of one token (for log-probabilities).
    """

    def __init__(self, kind: str, model: str, token_text):
        self.kind, self.model, self.token_text = kind, model, token_text
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.offsets = {}  # {choice index: text offset}, for completions' log-probabilities

    def _head(self) -> dict:
        return {"id": self.id, "created": self.created, "model": self.model}

    def logprobs(self, entries, index=0):
        """The ``logprobs`` block of [(token, text, (logprob, top))...] of choice ``index``,
        or None when empty."""
        entries = [e for e in entries if e[2] is not None]
        if not entries:
            return None
        if self.kind == "chat":
            return m.ChatLogprobs(content=[self._chat_logprob(tok, lp)
                                           for tok, _, lp in entries])
        doc = m.CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[],
                                   text_offset=[])
        for tok, text, (chosen, top) in entries:
            doc.tokens.append(self.token_text(tok))
            doc.token_logprobs.append(chosen)
            alternatives = {}
            for i, v in top:  # best first; ids sharing a text keep the best one's value
                alternatives.setdefault(self.token_text(i), v)
            doc.top_logprobs.append(alternatives)
            doc.text_offset.append(self.offsets.get(index, 0))
            self.offsets[index] = self.offsets.get(index, 0) + len(text)
        return doc

    def _chat_logprob(self, token, lp) -> m.TokenLogprob:
        chosen, top = lp

        def one(tok, value) -> dict:
            text = self.token_text(tok)
            return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

        return m.TokenLogprob(**one(token, chosen),
                              top_logprobs=[m.TopLogprob(**one(i, v)) for i, v in top])

    def whole(self, choices, usage: m.Usage) -> dict:
        """The non-streaming response; ``choices``: [(text, finish_reason, tool calls,
        entries)], in order of their index (chat text None: only calls)."""
        out = []
        for index, (text, finish_reason, calls, entries) in enumerate(choices):
            lp = self.logprobs(entries, index)
            if self.kind == "chat":
                message = m.Message(content=text, tool_calls=list(calls) or None)
                out.append(m.ChatChoice(index=index, message=message, logprobs=lp,
                                        finish_reason=finish_reason))
            else:
                out.append(m.CompletionChoice(index=index, text=text, logprobs=lp,
                                              finish_reason=finish_reason))
        body = m.ChatCompletion if self.kind == "chat" else m.Completion
        return body(**self._head(), choices=out, usage=usage).dump()

    def chunk(self, text: str, entries=(), finish_reason=None, first=False, index=0,
              calls=()) -> dict:
        """One stream chunk of choice ``index`` carrying ``text`` (the first chat chunk also
        names the role), or its tool ``calls`` whole."""
        lp = self.logprobs(entries, index)
        if self.kind == "chat":
            delta = m.Delta(role="assistant", content=text) if first else (
                m.Delta(content=text) if text or finish_reason is None else m.Delta())
            if calls:
                delta = m.Delta(tool_calls=[m.ToolCallDelta(index=i, id=c.id, function=c.function)
                                            for i, c in enumerate(calls)])
            choice = m.ChunkChoice(index=index, delta=delta, logprobs=lp,
                                   finish_reason=finish_reason)
            return m.ChatCompletionChunk(**self._head(), choices=[choice]).dump()
        choice = m.CompletionChoice(index=index, text=text, logprobs=lp,
                                    finish_reason=finish_reason)
        return m.CompletionChunk(**self._head(), choices=[choice]).dump()

    def usage_chunk(self, usage: m.Usage) -> dict:
        """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
        body = m.ChatCompletionChunk if self.kind == "chat" else m.CompletionChunk
        return body(**self._head(), choices=[], usage=usage).dump()


def total_usage(usages, n: int) -> m.Usage:
    """One request's usage over its choices (``n`` per prompt, a prompt's first choice
    first): each prompt's tokens once, every choice's completion tokens."""
    prompts = usages[::n]
    prompt = sum(u.prompt_tokens for u in prompts)
    completion = sum(u.completion_tokens for u in usages)
    cached = sum(u.prompt_tokens_details.cached_tokens for u in prompts)
    return usage(prompt, completion, cached)


def usage(prompt: int, completion: int, cached: int) -> m.Usage:
    """OpenAI's usage block: ``cached`` of the ``prompt`` tokens supplied by a kept session."""
    return m.Usage(prompt_tokens=prompt, completion_tokens=completion,
                   total_tokens=prompt + completion,
                   prompt_tokens_details=m.PromptTokensDetails(cached_tokens=cached))


__all__ = ["ResponseBuilder", "total_usage", "usage"]
