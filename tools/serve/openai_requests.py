"""OpenAI request bodies, checked field by field into a :class:`TextRequest`.

Every field a client may send is listed here with its type and domain. A wrong type, a value
out of range, an unknown field, or a field whose non-default value this server does not
implement (``echo``, tools, ...) is a :class:`RequestError`
(HTTP 400, naming the field): a request is served exactly as asked, or refused.
No mlx import.
"""

import json
import math
from dataclasses import dataclass, field

from mlxgraph.generation.options import MAX_COUNT, MAX_LOGIT_BIAS, MAX_PENALTY, SAMPLING_ONLY
from mlxgraph.schema.errors import Error

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_TOP_LOGPROBS = 20
MAX_MESSAGES = 4096
MAX_TOKEN_ID = MAX_COUNT
# Fields a client may send that change nothing here (bookkeeping on OpenAI's side).
INERT = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls"})
# The fields `mlxgraph serve --temp/--seed/--top-k/--top-p/--min-p` give defaults for, in the
# order they are settled (the temperature first: the filters' defaults depend on it).
SERVER_DEFAULTS = ("temperature", "seed", "top_k", "top_p", "min_p")
FILTERS = frozenset({"top_k", "top_p", "min_p"})


class RequestError(Error):
    """A request refused with an HTTP status and an OpenAI-style error body.

    Args:
        message: one line naming what is wrong.
        param: the request field at fault (None: the request as a whole).
        status: the HTTP status (400 unless told).
        code: OpenAI's machine-readable code, when one fits.
    """

    def __init__(self, message, param=None, status=400, code=None, kind="invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.kind = (
            message, param, status, code, kind)

    def body(self) -> dict:
        """The error document: {"error": {"message", "type", "param", "code"}}."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


@dataclass
class TextRequest:
    """One completion or chat request, checked. ``prompt`` is text or token ids (completions);
    ``messages`` the chat messages (chat). ``logprobs``: how many top alternatives per token
    (None: no log-probabilities)."""

    kind: str  # "completion" | "chat"
    model: str | None = None
    prompt: object = None
    messages: list | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict = field(default_factory=dict)
    stop: tuple = ()
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    extra: dict = field(default_factory=dict)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _int(lo, hi):
    def check(name, v):
        if not _is_int(v) or not lo <= v <= hi:
            raise RequestError(f"'{name}' must be an integer in [{lo}, {hi}], got {v!r}", name)
        return int(v)
    return check


def _number(lo, hi, open_lo=False, open_hi=False):
    def check(name, v):
        ok = _is_number(v) and (v > lo if open_lo else v >= lo) and (v < hi if open_hi else v <= hi)
        if not ok:
            span = f"{'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}"
            raise RequestError(f"'{name}' must be a number in {span}, got {v!r}", name)
        return float(v)
    return check


def _bool(name, v):
    if not isinstance(v, bool):
        raise RequestError(f"'{name}' must be true or false, got {v!r}", name)
    return v


def _string(name, v):
    if not isinstance(v, str):
        raise RequestError(f"'{name}' must be a string, got {type(v).__name__}", name)
    return v


def _stop(name, v):
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise RequestError(f"'{name}' must be a string or a list of strings", name)
    if len(stops) > MAX_STOP_STRINGS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise RequestError(f"'{name}': at most {MAX_STOP_STRINGS} strings of 1 to "
                           f"{MAX_STOP_CHARS} characters", name)
    return tuple(stops)


def _logit_bias(name, v):
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]} -> {int: float} (the ids are
    checked against the vocabulary with the prompt's)."""
    if not isinstance(v, dict):
        raise RequestError(f"'{name}' must be an object of token ids to numbers", name)
    out = {}
    for key, bias in v.items():
        if not (key.isascii() and key.isdigit()) or int(key) > MAX_TOKEN_ID:
            raise RequestError(f"'{name}' keys must be token ids (strings of digits), got "
                               f"{key!r}", name)
        if not _is_number(bias) or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise RequestError(f"'{name}' values must be numbers in [-{MAX_LOGIT_BIAS:g}, "
                               f"{MAX_LOGIT_BIAS:g}], got {bias!r} for token {key}", name)
        out[int(key)] = float(bias)
    return out


def _only(default, what):
    """A field accepted only at its default (what it would change is not implemented)."""
    def check(name, v):
        if v != default or type(v) is not type(default):
            raise RequestError(f"'{name}' {what} is not supported by this server (only "
                               f"{json.dumps(default)})", name)
        return v
    return check


def _inert(name, v):
    return v


COMMON = {
    "model": _string,
    "max_tokens": _int(1, 2**31 - 1),
    "temperature": _number(0.0, 100.0),
    "top_p": _number(0.0, 1.0, open_lo=True),
    "top_k": _int(0, 2**31 - 1),
    "min_p": _number(0.0, 1.0, open_hi=True),
    "repetition_penalty": _number(0.0, 100.0, open_lo=True),
    "seed": _int(0, 2**63 - 1),
    "stop": _stop,
    "stream": _bool,
    "n": _only(1, "other than 1"),
    "presence_penalty": _number(-MAX_PENALTY, MAX_PENALTY),
    "frequency_penalty": _number(-MAX_PENALTY, MAX_PENALTY),
    "logit_bias": _logit_bias,
    "ignore_eos": _bool,  # vLLM's extension: generate past the model's EOS tokens
    **{name: _inert for name in INERT},
}
COMPLETION = {
    **COMMON,
    "prompt": _inert,  # checked by _prompt
    "logprobs": _int(0, MAX_TOP_LOGPROBS),
    "echo": _only(False, "true"),
    "best_of": _only(1, "other than 1"),
    "suffix": _only("", "with text"),
}
CHAT = {
    **COMMON,
    "messages": _inert,  # checked by _messages
    "max_completion_tokens": _int(1, 2**31 - 1),
    "logprobs": _bool,
    "top_logprobs": _int(0, MAX_TOP_LOGPROBS),
    "tools": _only([], "with tools"),
    "tool_choice": _only("none", "other than \"none\""),
    "response_format": _only({"type": "text"}, "other than text"),
}


def _fields(doc: dict, table: dict) -> dict:
    """{name: checked value} of the fields present and not null."""
    out = {}
    for name, value in doc.items():
        if name not in table and name != "stream_options":
            raise RequestError(f"unknown field '{name}'", name)
        if value is None or name == "stream_options":
            continue
        out[name] = table[name](name, value)
    return out


def _stream_options(doc: dict) -> bool:
    opts = doc.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict) or set(opts) - {"include_usage"}:
        raise RequestError("'stream_options' may only hold 'include_usage'", "stream_options")
    if not doc.get("stream"):
        raise RequestError("'stream_options' needs 'stream': true", "stream_options")
    return _bool("stream_options.include_usage", opts.get("include_usage", False))


def _prompt(v):
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
        v = v[0]  # a batch of one prompt
    if isinstance(v, str):
        if not v:
            raise RequestError("'prompt' is empty", "prompt")
        return v
    if isinstance(v, list) and v and all(_is_int(t) for t in v):
        return [int(t) for t in v]
    raise RequestError("'prompt' must be a non-empty string or list of token ids (one prompt)",
                       "prompt")


def _content(i, content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                    part.get("text"), str):
                raise RequestError(f"messages[{i}].content: only text parts are supported",
                                   "messages")
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(f"messages[{i}].content must be a string or a list of text parts",
                       "messages")


def _messages(v):
    if not isinstance(v, list) or not v or len(v) > MAX_MESSAGES:
        raise RequestError(f"'messages' must be a list of 1 to {MAX_MESSAGES} messages",
                           "messages")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string 'role'",
                               "messages")
        if m["role"] not in ("system", "developer", "user", "assistant"):
            raise RequestError(f"messages[{i}].role {m['role']!r} is not supported", "messages")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise RequestError(f"messages[{i}]: unsupported field '{sorted(extra)[0]}'",
                               "messages")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": _content(i, m.get("content"))})
    return out


def _sampling(req, fields, defaults) -> None:
    """The request's sampling fields; one it does not give takes the server-wide default
    (``mlxgraph serve --temp ...``), the filters (top_k, top_p, min_p) only when the request
    samples. A greedy request (temperature 0) drops its top_k, top_p, min_p and seed, which
    change nothing in an argmax: OpenAI clients send a seed or top_p with temperature 0 as a
    matter of course, so the server accepts them (docs/serve.md), where generate refuses."""
    for name in SERVER_DEFAULTS:
        if name in fields:
            setattr(req, name, fields[name])
        elif name in defaults and (name not in FILTERS or req.temperature > 0):
            setattr(req, name, defaults[name])
    if req.temperature == 0:
        for name, off in SAMPLING_ONLY.items():
            setattr(req, name, off)


def _request(kind, doc, fields, defaults) -> TextRequest:
    req = TextRequest(kind=kind)
    for name in ("model", "max_tokens", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "logit_bias", "stream", "ignore_eos"):
        if name in fields:
            setattr(req, name, fields[name])
    _sampling(req, fields, defaults or {})
    req.stop = fields.get("stop", ())
    req.include_usage = _stream_options(doc)
    return req


def parse_completion(doc: dict, defaults=None) -> TextRequest:
    """A /v1/completions body; ``defaults``: the server-wide sampling defaults ({field:
    value}) for the fields it does not give. Raises RequestError."""
    fields = _fields(doc, COMPLETION)
    if "prompt" not in fields:
        raise RequestError("'prompt' is required", "prompt")
    req = _request("completion", doc, fields, defaults)
    req.prompt = _prompt(fields["prompt"])
    req.logprobs = fields.get("logprobs")
    return req


def parse_chat(doc: dict, defaults=None) -> TextRequest:
    """A /v1/chat/completions body; ``defaults`` as parse_completion's. Raises RequestError."""
    fields = _fields(doc, CHAT)
    if "messages" not in fields:
        raise RequestError("'messages' is required", "messages")
    req = _request("chat", doc, fields, defaults)
    req.messages = _messages(fields["messages"])
    if "max_completion_tokens" in fields:
        req.max_tokens = fields["max_completion_tokens"]
    if "top_logprobs" in fields and not fields.get("logprobs"):
        raise RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    if fields.get("logprobs"):
        req.logprobs = fields.get("top_logprobs", 0)
    return req


__all__ = ["RequestError", "TextRequest", "parse_chat", "parse_completion"]
