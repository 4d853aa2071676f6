"""OpenAI request bodies into a :class:`TextRequest`: the fields checked by their models
(request_models.py), then what depends on several of them (server defaults, a grammar and
its EOS, tools and tool_choice, echo and logprobs). A wrong type, a value out of range, an
unknown field, or a field whose non-default value this server does not implement
(``best_of``, ``suffix``) is a :class:`RequestError` (HTTP 400, naming the field): a request
is served exactly as asked, or refused. No mlx import.
"""

from dataclasses import dataclass, field

from mlxgraph.generation.options import SAMPLING_ONLY
from mlxgraph.tools.serve.chat_messages import CHOICES, messages
from mlxgraph.tools.serve.request_fields import RequestError, boolean, is_int
from mlxgraph.tools.serve.request_models import MAX_CHOICES, ChatBody, CompletionBody
from mlxgraph.tools.serve.request_models import fields as request_fields

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
    fields = request_fields(CompletionBody, doc)
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
    fields = request_fields(ChatBody, doc)
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
