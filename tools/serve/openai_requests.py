"""OpenAI request bodies, checked field by field into a :class:`TextRequest`.

Every field a client may send is listed here with its type and domain. A wrong type, a value
out of range, an unknown field, or a field whose non-default value this server does not
implement (``best_of``, tools, ...) is a :class:`RequestError`
(HTTP 400, naming the field): a request is served exactly as asked, or refused.
No mlx import.
"""

from dataclasses import dataclass, field

from mlxgraph.generation.options import MAX_PENALTY, SAMPLING_ONLY
from mlxgraph.tools.serve.chat_messages import CHOICES, messages, tool_choice, tools
from mlxgraph.tools.serve.request_fields import (
    RequestError,
    boolean,
    inert,
    integer,
    is_int,
    logit_bias,
    number,
    only,
    response_format,
    stop_strings,
    string,
    template_kwargs,
)

MAX_TOP_LOGPROBS = 20
MAX_CHOICES = 128  # n, and prompts in a list: also at most the server's --max-sessions
# Fields a client may send that change nothing here (bookkeeping on OpenAI's side).
INERT = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls"})
# The fields `mlxgraph serve --temp/--seed/--top-k/--top-p/--min-p` give defaults for, in the
# order they are settled (the temperature first: the filters' defaults depend on it).
SERVER_DEFAULTS = ("temperature", "seed", "top_k", "top_p", "min_p")
FILTERS = frozenset({"top_k", "top_p", "min_p"})


@dataclass
class TextRequest:
    """One completion or chat request, checked. ``prompts``: each prompt a text or token ids
    (completions: one choice each, times ``n``); ``messages`` the chat messages (chat).
    ``logprobs``: how many top alternatives per token (None: no log-probabilities)."""

    kind: str  # "completion" | "chat"
    model: str | None = None
    prompts: list = field(default_factory=list)
    messages: list | None = None
    n: int = 1
    echo: bool = False
    template_kwargs: dict = field(default_factory=dict)
    constraint: tuple | None = None  # (kind, value) of generation/constrained.py's grammar()
    tools: list = field(default_factory=list)
    tool_choice: str = "none"  # none, auto, required, or a function's name
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


COMMON = {
    "model": string,
    "max_tokens": integer(1, 2**31 - 1),
    "temperature": number(0.0, 100.0),
    "top_p": number(0.0, 1.0, open_lo=True),
    "top_k": integer(0, 2**31 - 1),
    "min_p": number(0.0, 1.0, open_hi=True),
    "repetition_penalty": number(0.0, 100.0, open_lo=True),
    "seed": integer(0, 2**63 - 1),
    "stop": stop_strings,
    "stream": boolean,
    "n": integer(1, MAX_CHOICES),
    "presence_penalty": number(-MAX_PENALTY, MAX_PENALTY),
    "frequency_penalty": number(-MAX_PENALTY, MAX_PENALTY),
    "logit_bias": logit_bias,
    "ignore_eos": boolean,  # vLLM's extension: generate past the model's EOS tokens
    "response_format": response_format,
    "grammar": string,  # llama.cpp's extension: a GBNF grammar
    **{name: inert for name in INERT},
}
COMPLETION = {
    **COMMON,
    "prompt": inert,  # checked by _prompts
    "logprobs": integer(0, MAX_TOP_LOGPROBS),
    "echo": boolean,
    "best_of": only(1, "other than 1"),
    "suffix": only("", "with text"),
}
CHAT = {
    **COMMON,
    "messages": inert,  # checked by chat_messages.messages
    "max_completion_tokens": integer(1, 2**31 - 1),
    "logprobs": boolean,
    "top_logprobs": integer(0, MAX_TOP_LOGPROBS),
    "chat_template_kwargs": template_kwargs,  # vLLM's extension
    "tools": tools,
    "tool_choice": tool_choice,
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
    return boolean("stream_options.include_usage", opts.get("include_usage", False))


def _prompts(v) -> list:
    """OpenAI's prompt: a text, token ids, or a list of either (each its own choice)."""
    if isinstance(v, list) and v and all(isinstance(p, (str, list)) for p in v):
        if len(v) > MAX_CHOICES:
            raise RequestError(f"'prompt': at most {MAX_CHOICES} prompts in a list", "prompt")
        return [_prompt(p) for p in v]
    return [_prompt(v)]


def _prompt(v):
    if isinstance(v, str):
        if not v:
            raise RequestError("'prompt' is empty", "prompt")
        return v
    if isinstance(v, list) and v and all(is_int(t) for t in v):
        return [int(t) for t in v]
    raise RequestError("'prompt' must be a non-empty string or list of token ids, or a list "
                       "of those", "prompt")


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
                 "frequency_penalty", "logit_bias", "stream", "ignore_eos", "n"):
        if name in fields:
            setattr(req, name, fields[name])
    _sampling(req, fields, defaults or {})
    if "grammar" in fields and fields.get("response_format"):
        raise RequestError("give 'grammar' or a 'response_format', not both", "grammar")
    req.constraint = fields.get("response_format") or (
        ("gbnf", fields["grammar"]) if "grammar" in fields else None)
    if req.constraint is not None and req.ignore_eos:
        raise RequestError("'ignore_eos' with a grammar: the grammar ends at the EOS token",
                           "ignore_eos")
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
    req.prompts = _prompts(fields["prompt"])
    req.logprobs = fields.get("logprobs")
    req.echo = fields.get("echo", False)
    if req.echo and req.logprobs is not None:  # OpenAI's would score the prompt's tokens too
        raise RequestError("'echo' with 'logprobs' is not supported by this server (the "
                           "prompt's log-probabilities are not computed)", "echo")
    return req


def _tools(req, fields) -> None:
    """The chat request's tools: handed to the template (as transformers does), and the
    answer parsed for calls unless tool_choice is none (required or a name: constrained)."""
    given = fields.get("tools") or []
    names = {t["function"]["name"] for t in given}
    choice = fields.get("tool_choice", "auto" if given else "none")
    if choice != "none" and not given:
        raise RequestError("'tool_choice' needs 'tools'", "tool_choice")
    if choice not in CHOICES and choice not in names:
        raise RequestError(f"'tool_choice': no tool is named {choice!r}", "tool_choice")
    if given:
        req.template_kwargs = {**req.template_kwargs, "tools": given}
    req.tools, req.tool_choice = given, choice
    if choice == "none":
        return
    if fields.get("logprobs"):
        raise RequestError("'logprobs' with tools is not supported by this server (the "
                           "answer is parsed for calls)", "logprobs")
    if choice == "auto" and any(t["function"].get("strict") for t in given):
        raise RequestError("'tools': strict functions need tool_choice required or a named "
                           "function (which constrain the call to the schema)", "tools")
    if choice != "auto" and req.constraint is not None:
        raise RequestError("'tool_choice' that forces a call cannot be combined with a "
                           "response_format or grammar", "tool_choice")


def parse_chat(doc: dict, defaults=None) -> TextRequest:
    """A /v1/chat/completions body; ``defaults`` as parse_completion's. Raises RequestError."""
    fields = _fields(doc, CHAT)
    if "messages" not in fields:
        raise RequestError("'messages' is required", "messages")
    req = _request("chat", doc, fields, defaults)
    req.messages = messages(fields["messages"])
    req.template_kwargs = fields.get("chat_template_kwargs", {})
    _tools(req, fields)
    if "max_completion_tokens" in fields:
        req.max_tokens = fields["max_completion_tokens"]
    if "top_logprobs" in fields and not fields.get("logprobs"):
        raise RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    if fields.get("logprobs"):
        req.logprobs = fields.get("top_logprobs", 0)
    return req


__all__ = ["MAX_CHOICES", "RequestError", "TextRequest", "parse_chat", "parse_completion"]
