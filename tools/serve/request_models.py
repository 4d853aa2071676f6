"""The OpenAI request bodies, declared once as pydantic models (as vLLM declares its).

Each field names its checker (request_fields.py, chat_messages.py): a wrong type or a
value out of range is a RequestError (400) naming the field, with the message the checker
writes; an unknown field is refused (``extra="forbid"``); null is the same as absent.
openai_requests.py turns a checked body into a TextRequest. No mlx import.
"""

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from mlxgraph.generation.options import MAX_PENALTY
from mlxgraph.tools.serve import chat_messages
from mlxgraph.tools.serve import request_fields as check
from mlxgraph.tools.serve.request_fields import RequestError, boolean, integer, number, string

MAX_TOP_LOGPROBS = 20
MAX_CHOICES = 128  # n, and prompts in a list: also at most the server's --max-sessions


def checked(fn):
    """A field checked by ``fn(name, value)`` (the class body's own names would shadow a
    checker of the same name: hence ``check.``); null passes as absent."""
    def validate(value, info):
        return value if value is None else fn(info.field_name, value)
    return Annotated[Any, BeforeValidator(validate)]


class _Body(BaseModel):
    """The fields of both endpoints."""

    model_config = ConfigDict(extra="forbid")

    model: checked(string) = None
    max_tokens: checked(integer(1, 2**31 - 1)) = None
    temperature: checked(number(0.0, 100.0)) = None
    top_p: checked(number(0.0, 1.0, open_lo=True)) = None
    top_k: checked(integer(0, 2**31 - 1)) = None
    min_p: checked(number(0.0, 1.0, open_hi=True)) = None
    repetition_penalty: checked(number(0.0, 100.0, open_lo=True)) = None
    seed: checked(integer(0, 2**63 - 1)) = None
    stop: checked(check.stop_strings) = None
    stream: checked(boolean) = None
    stream_options: Any = None  # checked with stream (openai_requests._stream_options)
    n: checked(integer(1, MAX_CHOICES)) = None
    presence_penalty: checked(number(-MAX_PENALTY, MAX_PENALTY)) = None
    frequency_penalty: checked(number(-MAX_PENALTY, MAX_PENALTY)) = None
    logit_bias: checked(check.logit_bias) = None
    ignore_eos: checked(boolean) = None  # vLLM's extension: generate past EOS tokens
    response_format: checked(check.response_format) = None
    grammar: checked(string) = None  # llama.cpp's extension: a GBNF grammar
    # bookkeeping on OpenAI's side that changes nothing here
    user: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    parallel_tool_calls: Any = None


class CompletionBody(_Body):
    """/v1/completions."""

    prompt: Any = None  # checked by openai_requests._prompts
    logprobs: checked(integer(0, MAX_TOP_LOGPROBS)) = None
    echo: checked(boolean) = None
    best_of: checked(check.only(1, "other than 1")) = None
    suffix: checked(check.only("", "with text")) = None


class ChatBody(_Body):
    """/v1/chat/completions."""

    messages: Any = None  # checked by chat_messages.messages
    max_completion_tokens: checked(integer(1, 2**31 - 1)) = None
    logprobs: checked(boolean) = None
    top_logprobs: checked(integer(0, MAX_TOP_LOGPROBS)) = None
    chat_template_kwargs: checked(check.template_kwargs) = None  # vLLM's extension
    tools: checked(chat_messages.tools) = None
    tool_choice: checked(chat_messages.tool_choice) = None


def fields(model, doc: dict) -> dict:
    """{name: checked value} of the body's fields that are present and not null (but
    stream_options). Raises RequestError (400 naming the field)."""
    try:
        body = model.model_validate(doc)
    except ValidationError as e:
        error = e.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else None
        if error["type"] == "extra_forbidden":
            raise RequestError(f"unknown field '{name}'", name) from None
        raise RequestError(f"'{name}': {error['msg']}", name) from None
    return {name: getattr(body, name) for name in body.model_fields_set
            if getattr(body, name) is not None and name != "stream_options"}


__all__ = ["MAX_CHOICES", "MAX_TOP_LOGPROBS", "ChatBody", "CompletionBody", "fields"]
