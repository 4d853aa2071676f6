"""Tool calls in a model's answer: parsed into OpenAI's ``tool_calls``, and the grammar
that makes a model call one (``tool_choice`` "required" or a named function).

Two syntaxes, chosen by the chat template: Hermes/Qwen (the template mentions
``<tool_call>``): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks,
text around them the content; Llama 3 JSON (any other template): the whole answer is one or
more ``{"name": ..., "parameters": {...}}`` objects (``arguments`` also read), separated by
``;``, after an optional ``<|python_tag|>``. An answer that is not entirely such calls of
the request's functions stays text: nothing is dropped. No mlx import.
"""

import json
import re
import uuid

from mlxgraph.tools.serve.response_models import Function, ToolCall

BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def style_of(template: str | None) -> str:
    """"hermes" or "llama3", by the chat template's text."""
    return "hermes" if template and "<tool_call>" in template else "llama3"


def parse(text: str, names, style: str):
    """(content or None, [ToolCall]) of an answer; ([] calls: the text as it is)."""
    if style == "hermes":
        bodies = BLOCK.findall(text)
        rest = BLOCK.sub("", text).strip()
        if not bodies or "<tool_call>" in rest:
            return text, []
        found = [_call(_json(b), names, "arguments") for b in bodies]
    else:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        found, rest = _json_calls(body, names), ""
    if not found or any(c is None for c in found):
        return text, []
    return rest or None, [ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=Function(
        name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
        for name, arguments in found]


def grammar(tools: list, choice: str, style: str) -> tuple:
    """The constraint (kind, value) of an answer that is one call of ``choice`` (a name)
    or, for "required", of any of ``tools``; its arguments follow the function's schema."""
    key = "arguments" if style == "hermes" else "parameters"
    schemas = [{"type": "object", "properties": {
        "name": {"const": t["function"]["name"]},
        key: t["function"].get("parameters") or {"type": "object"}},
        "required": ["name", key], "additionalProperties": False}
        for t in tools if choice == "required" or t["function"]["name"] == choice]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if style == "llama3":
        return ("json_schema", schema)
    # compact JSON, as constrained.grammar makes it (free whitespace: a model pads on)
    schema = {**schema, "x-guidance": {"whitespace_flexible": False}}
    return ("lark", f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json '
                    f'{json.dumps(schema)}')


def _json(text):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(doc, names, *keys):
    """(name, arguments) of a call object of one of ``names``, else None."""
    if not isinstance(doc, dict) or doc.get("name") not in names:
        return None
    arguments = next((doc[k] for k in keys if k in doc), None)
    return (doc["name"], arguments) if isinstance(arguments, dict) else None


def _json_calls(body: str, names) -> list:
    """Llama 3's calls: JSON objects separated by ';' ([None] when the body is not that)."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            doc, at = decoder.raw_decode(body, at)
        except ValueError:
            return [None]
        out.append(_call(doc, names, "parameters", "arguments"))
        while at < len(body) and body[at] in " \n\t;":
            at += 1
    return out


__all__ = ["grammar", "parse", "style_of"]
