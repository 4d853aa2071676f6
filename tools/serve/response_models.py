"""The response bodies, declared once as pydantic models (as request_models.py declares the
requests): completions and chat completions, whole or as stream chunks, their usage,
log-probabilities and tool calls, the error body, the model list, /tokenize and /detokenize.

A field typed ``X | None`` is sent, null or not; an ``Omitted`` one is left out while None
(OpenAI's optional fields that this server does not always send).
``Wire.dump()`` is a model's document. No mlx import.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


def _absent(value) -> bool:
    return value is None


class Wire(BaseModel):
    """A document as sent: no field beyond those declared."""

    model_config = ConfigDict(extra="forbid")

    def dump(self) -> dict:
        """The document, for ``json.dumps`` (floats as they are, as JSONResponse sends them)."""
        return self.model_dump()


def omitted(kind):
    """``kind``, left out of the document while None."""
    return Annotated[kind | None, Field(default=None, exclude_if=_absent)]


class ErrorDetail(Wire):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(Wire):
    """OpenAI's error document (also a stream's last event before [DONE])."""

    error: ErrorDetail


class ModelCard(Wire):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(Wire):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Tokenized(Wire):
    """/tokenize's answer (vLLM's shape)."""

    tokens: list[int]
    count: int
    max_model_len: int


class Detokenized(Wire):
    """/detokenize's answer (vLLM's shape)."""

    prompt: str


class PromptTokensDetails(Wire):
    cached_tokens: int


class Usage(Wire):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionLogprobs(Wire):
    """/v1/completions' layout: parallel lists, top alternatives by text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TopLogprob(Wire):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Wire):
    """/v1/chat/completions' layout: one entry a token."""

    content: list[TokenLogprob]


class Function(Wire):
    name: str
    arguments: str  # JSON text


class ToolCall(Wire):
    id: str
    type: Literal["function"] = "function"
    function: Function


class ToolCallDelta(ToolCall):
    """A stream's tool call: sent whole, with its place among the choice's calls."""

    index: int


class Message(Wire):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: omitted(list[ToolCall])


class Delta(Wire):
    role: omitted(Literal["assistant"])
    content: omitted(str)
    tool_calls: omitted(list[ToolCallDelta])


class CompletionChoice(Wire):
    """A completion's choice, whole or a chunk's piece of it."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class ChatChoice(Wire):
    index: int
    message: Message
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChunkChoice(Wire):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class _Head(Wire):
    id: str
    created: int
    model: str


class Completion(_Head):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage


class ChatCompletion(_Head):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class CompletionChunk(_Head):
    """A completion stream's event (OpenAI names it as the whole response); the last one,
    with ``stream_options.include_usage``, has no choices and the usage."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: omitted(Usage)


class ChatCompletionChunk(_Head):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChunkChoice]
    usage: omitted(Usage)


__all__ = ["ChatChoice", "ChatCompletion", "ChatCompletionChunk", "ChatLogprobs",
           "ChunkChoice", "Completion", "CompletionChoice", "CompletionChunk",
           "CompletionLogprobs", "Delta", "Detokenized", "ErrorBody", "ErrorDetail",
           "Function", "Message", "ModelCard", "ModelList", "PromptTokensDetails",
           "TokenLogprob", "Tokenized", "TopLogprob", "ToolCall", "ToolCallDelta", "Usage",
           "Wire", "omitted"]
