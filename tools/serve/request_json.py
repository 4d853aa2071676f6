"""A request body as a JSON document: UTF-8, valid JSON, an object, and text throughout.

JSON may escape what is not text (a lone UTF-16 surrogate, ``"\\ud800"``); such a string is
refused here (400, naming the field) before anything that needs text (the tokenizer, a
response) sees it. No mlx import.
"""

import json

from mlxgraph.tools.serve.openai_requests import RequestError


def parse_json(raw: bytes):
    """The JSON document of a request body.

    Raises:
        RequestError: not UTF-8, not JSON, nested too deep, not an object, or a string with
            a lone surrogate.
    """
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RequestError("the request body is not UTF-8 text") from None
    except RecursionError:
        raise RequestError("the request body is nested too deeply") from None
    except ValueError as e:
        raise RequestError(f"the request body is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(doc).__name__}")
    _refuse_surrogates(doc)
    return doc


def _refuse_surrogates(doc) -> None:
    """JSON may escape a lone UTF-16 surrogate ("\\ud800"), which is not text: refused
    here (400) before any code that needs text (the tokenizer, a response) sees it."""
    stack = [(doc, None)]
    while stack:
        value, field = stack.pop()
        if isinstance(value, dict):
            stack.extend((x, field or k) for k, v in value.items() for x in (k, v))
        elif isinstance(value, list):
            stack.extend((x, field) for x in value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                param = field if field is None or field.isascii() else repr(field)[1:-1]
                raise RequestError(f"the request has a lone UTF-16 surrogate "
                                   f"({value[e.start]!r}), which is not text", param) from None


__all__ = ["parse_json"]
