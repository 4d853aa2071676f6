"""OpenAI response bodies: completions and chat completions, whole or as stream chunks, with
``usage``, ``finish_reason`` and log-probabilities in OpenAI's two layouts. No mlx import.

Log-probabilities are those of the model's own distribution (log-softmax of the logits,
before temperature, top-k/top-p/min-p or the repetition penalty), as ``logprobs`` reports
them in OpenAI's API.
"""

import time
import uuid


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

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def logprobs(self, entries, index=0) -> dict | None:
        """The ``logprobs`` block of [(token, text, (logprob, top))...] of choice ``index``,
        or None when empty."""
        entries = [e for e in entries if e[2] is not None]
        if not entries:
            return None
        if self.kind == "chat":
            return {"content": [self._chat_logprob(tok, lp) for tok, _, lp in entries]}
        doc = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for tok, text, (chosen, top) in entries:
            doc["tokens"].append(self.token_text(tok))
            doc["token_logprobs"].append(chosen)
            alternatives = {}
            for i, v in top:  # best first; ids sharing a text keep the best one's value
                alternatives.setdefault(self.token_text(i), v)
            doc["top_logprobs"].append(alternatives)
            doc["text_offset"].append(self.offsets.get(index, 0))
            self.offsets[index] = self.offsets.get(index, 0) + len(text)
        return doc

    def _chat_logprob(self, token, lp) -> dict:
        chosen, top = lp

        def one(tok, value):
            text = self.token_text(tok)
            return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

        return {**one(token, chosen), "top_logprobs": [one(i, v) for i, v in top]}

    def whole(self, choices, usage: dict) -> dict:
        """The non-streaming response; ``choices``: [(text, finish_reason, tool calls,
        entries)], in order of their index (chat text None: only calls)."""
        out = []
        for index, (text, finish_reason, calls, entries) in enumerate(choices):
            lp = self.logprobs(entries, index)
            if self.kind == "chat":
                message = {"role": "assistant", "content": text}
                if calls:
                    message["tool_calls"] = calls
                out.append({"index": index, "message": message, "logprobs": lp,
                            "finish_reason": finish_reason})
            else:
                out.append({"index": index, "text": text, "logprobs": lp,
                            "finish_reason": finish_reason})
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": out, "usage": usage}

    def chunk(self, text: str, entries=(), finish_reason=None, first=False, index=0,
              calls=()) -> dict:
        """One stream chunk of choice ``index`` carrying ``text`` (the first chat chunk also
        names the role), or its tool ``calls`` whole."""
        lp = self.logprobs(entries, index)
        if self.kind == "chat":
            delta = {"role": "assistant", "content": text} if first else (
                {"content": text} if text or finish_reason is None else {})
            if calls:
                delta = {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}
            choice = {"index": index, "delta": delta, "logprobs": lp,
                      "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": index, "text": text, "logprobs": lp, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: dict) -> dict:
        """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage}


def total_usage(usages, n: int) -> dict:
    """One request's usage over its choices (``n`` per prompt, a prompt's first choice
    first): each prompt's tokens once, every choice's completion tokens."""
    prompts = usages[::n]
    prompt = sum(u["prompt_tokens"] for u in prompts)
    completion = sum(u["completion_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in prompts)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


__all__ = ["ResponseBuilder", "total_usage"]
