"""Checkers of single OpenAI request fields: ``check(name, value) -> value`` or a
RequestError (400) naming the field. No mlx import."""

import json
import math

from mlxgraph.generation.options import MAX_COUNT, MAX_LOGIT_BIAS
from mlxgraph.schema.errors import Error

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_TOKEN_ID = MAX_COUNT


class RequestError(Error):
    """A request refused with an HTTP status and an OpenAI-style error body
    (relay.error_doc).

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


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    return (is_int(v) or isinstance(v, float)) and math.isfinite(v)


def integer(lo, hi):
    def check(name, v):
        if not is_int(v) or not lo <= v <= hi:
            raise RequestError(f"'{name}' must be an integer in [{lo}, {hi}], got {v!r}", name)
        return int(v)
    return check


def number(lo, hi, open_lo=False, open_hi=False):
    def check(name, v):
        ok = is_number(v) and (v > lo if open_lo else v >= lo) and (v < hi if open_hi else v <= hi)
        if not ok:
            span = f"{'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}"
            raise RequestError(f"'{name}' must be a number in {span}, got {v!r}", name)
        return float(v)
    return check


def boolean(name, v):
    if not isinstance(v, bool):
        raise RequestError(f"'{name}' must be true or false, got {v!r}", name)
    return v


def string(name, v):
    if not isinstance(v, str):
        raise RequestError(f"'{name}' must be a string, got {type(v).__name__}", name)
    return v


def stop_strings(name, v):
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise RequestError(f"'{name}' must be a string or a list of strings", name)
    if len(stops) > MAX_STOP_STRINGS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise RequestError(f"'{name}': at most {MAX_STOP_STRINGS} strings of 1 to "
                           f"{MAX_STOP_CHARS} characters", name)
    return tuple(stops)


def logit_bias(name, v):
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]} -> {int: float} (the ids are
    checked against the vocabulary with the prompt's)."""
    if not isinstance(v, dict):
        raise RequestError(f"'{name}' must be an object of token ids to numbers", name)
    out = {}
    for key, bias in v.items():
        if not (key.isascii() and key.isdigit()) or int(key) > MAX_TOKEN_ID:
            raise RequestError(f"'{name}' keys must be token ids (strings of digits), got "
                               f"{key!r}", name)
        if not is_number(bias) or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise RequestError(f"'{name}' values must be numbers in [-{MAX_LOGIT_BIAS:g}, "
                               f"{MAX_LOGIT_BIAS:g}], got {bias!r} for token {key}", name)
        out[int(key)] = float(bias)
    return out


def only(default, what):
    """A field accepted only at its default (what it would change is not implemented)."""
    def check(name, v):
        if v != default or type(v) is not type(default):
            raise RequestError(f"'{name}' {what} is not supported by this server (only "
                               f"{json.dumps(default)})", name)
        return v
    return check


def inert(name, v):
    """A field checked elsewhere, or bookkeeping that changes nothing."""
    return v




# Names the chat template's own context holds (or will: tools); the special tokens end in
# "_token". chat_template_kwargs may not replace them.
RESERVED_TEMPLATE_NAMES = frozenset({"messages", "add_generation_prompt", "tools", "documents"})


def template_kwargs(name, v):
    """vLLM's chat_template_kwargs: {"identifier": JSON value} added to the chat template's
    variables (``enable_thinking`` and the like), never one the render sets itself."""
    if not isinstance(v, dict):
        raise RequestError(f"'{name}' must be an object of template variables", name)
    for key in v:
        if not key.isidentifier() or key in RESERVED_TEMPLATE_NAMES or key.endswith("_token"):
            raise RequestError(f"'{name}': {key!r} is not a template variable a request may "
                               "set (an identifier, not messages, add_generation_prompt, "
                               "tools, documents or a special token)", name)
    return dict(v)


def response_format(name, v):
    """OpenAI's response_format -> None (text), ("json_object", None) or ("json_schema",
    schema); the grammar itself is compiled with the request (400 when it does not)."""
    kind = v.get("type") if isinstance(v, dict) else None
    keys = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
    if kind not in keys:
        raise RequestError(f"'{name}' must be an object whose 'type' is text, json_object "
                           "or json_schema", name)
    if set(v) - keys[kind]:
        raise RequestError(f"'{name}': unknown field '{sorted(set(v) - keys[kind])[0]}'", name)
    if kind != "json_schema":
        return None if kind == "text" else ("json_object", None)
    spec = v.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or \
            not isinstance(spec.get("schema"), dict):
        raise RequestError(f"'{name}.json_schema' must be an object with a string 'name' and "
                           "an object 'schema'", name)
    extra = set(spec) - {"name", "schema", "strict", "description"}
    if extra or not isinstance(spec.get("strict", False), (bool, type(None))):
        raise RequestError(f"'{name}.json_schema' may hold name, schema, strict (a bool) and "
                           "description only", name)
    return ("json_schema", spec["schema"])


__all__ = ["RequestError", "boolean", "inert", "integer", "is_int", "is_number", "logit_bias",
           "number", "only", "response_format", "stop_strings", "string", "template_kwargs"]
