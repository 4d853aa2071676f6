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
        self.offset = 0  # text offset, for completions' log-probabilities

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def logprobs(self, entries) -> dict | None:
        """The ``logprobs`` block of [(token, text, (logprob, top))...], or None when empty."""
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
            doc["text_offset"].append(self.offset)
            self.offset += len(text)
        return doc

    def _chat_logprob(self, token, lp) -> dict:
        chosen, top = lp

        def one(tok, value):
            text = self.token_text(tok)
            return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

        return {**one(token, chosen), "top_logprobs": [one(i, v) for i, v in top]}

    def whole(self, text: str, finish_reason: str, usage: dict, entries) -> dict:
        """The non-streaming response."""
        lp = self.logprobs(entries)
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": lp, "finish_reason": finish_reason}
            return {**self._head("chat.completion"), "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice], "usage": usage}

    def chunk(self, text: str, entries=(), finish_reason=None, first=False) -> dict:
        """One stream chunk carrying ``text`` (the first chat chunk also names the role)."""
        lp = self.logprobs(entries)
        if self.kind == "chat":
            delta = {"role": "assistant", "content": text} if first else (
                {"content": text} if text or finish_reason is None else {})
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: dict) -> dict:
        """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage}


__all__ = ["ResponseBuilder"]
