"""Chat messages and tools of a request, checked into what a chat template reads.

Messages: system/developer/user/assistant/tool, text or text parts. An assistant message
may carry OpenAI's ``tool_calls`` (its ``arguments`` a JSON text, handed to the template as
the object transformers' templates expect, as vLLM does), and a ``tool`` message answers
one by ``tool_call_id``. Tools: OpenAI's ``{"type": "function", "function": {"name",
"description"?, "parameters"?, "strict"?}}``, handed to the template as ``tools`` the way
transformers' ``apply_chat_template(tools=...)`` does. No mlx import.
"""

import json
import re

from mlxgraph.tools.serve.request_fields import RequestError

MAX_MESSAGES = 4096
MAX_TOOLS = 128
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # OpenAI's function names
CHOICES = ("none", "auto", "required")


def _content(i, content, may_be_empty=False) -> str:
    if content is None and may_be_empty:
        return ""
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


def _calls(i, calls) -> list:
    """An assistant message's tool_calls, their arguments parsed from JSON text."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list) or not calls or len(calls) > MAX_TOOLS:
        raise RequestError(f"{where} must be a list of 1 to {MAX_TOOLS} calls", "messages")
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or call.get("type", "function") != "function" or \
                not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str) \
                or not isinstance(call.get("id", ""), str):
            raise RequestError(f"{where}: each call must be {{'id', 'type': 'function', "
                               "'function': {'name', 'arguments'}}", "messages")
        try:
            arguments = json.loads(fn["arguments"])
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise RequestError(f"{where}: 'arguments' must be a JSON object's text",
                               "messages")
        out.append({"id": call.get("id", ""), "type": "function",
                    "function": {"name": fn["name"], "arguments": arguments}})
    return out


def messages(v) -> list:
    """The checked messages, as the chat template reads them."""
    if not isinstance(v, list) or not v or len(v) > MAX_MESSAGES:
        raise RequestError(f"'messages' must be a list of 1 to {MAX_MESSAGES} messages",
                           "messages")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string 'role'",
                               "messages")
        role = m["role"]
        allowed = {"system": set(), "developer": set(), "user": set(),
                   "assistant": {"tool_calls"}, "tool": {"tool_call_id"}}.get(role)
        if allowed is None:
            raise RequestError(f"messages[{i}].role {role!r} is not supported", "messages")
        extra = set(m) - {"role", "content", "name"} - allowed
        if extra:
            raise RequestError(f"messages[{i}]: unsupported field '{sorted(extra)[0]}'",
                               "messages")
        calls = m.get("tool_calls")
        doc = {"role": "system" if role == "developer" else role,
               "content": _content(i, m.get("content"), may_be_empty=calls is not None)}
        if calls is not None:
            doc["tool_calls"] = _calls(i, calls)
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise RequestError(f"messages[{i}]: a tool message needs a string "
                                   "'tool_call_id'", "messages")
            doc["tool_call_id"] = m["tool_call_id"]
        out.append(doc)
    return out


def tools(name, v) -> list:
    """OpenAI's tools (functions only), checked."""
    if not isinstance(v, list) or len(v) > MAX_TOOLS:
        raise RequestError(f"'{name}' must be a list of at most {MAX_TOOLS} tools", name)
    seen = set()
    for t in v:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or t.get("type") != "function" or set(t) - {"type",
                                                                                "function"}:
            raise RequestError(f"'{name}': each tool must be {{'type': 'function', "
                               "'function': {...}}", name)
        if set(fn) - {"name", "description", "parameters", "strict"} or not isinstance(
                fn.get("name"), str) or not NAME.fullmatch(fn["name"]) or fn["name"] in seen:
            raise RequestError(f"'{name}': a function needs a unique 'name' of 1 to 64 "
                               "letters, digits, _ . or -, and may add description, "
                               "parameters and strict only", name)
        if not isinstance(fn.get("parameters", {}), dict) or not isinstance(
                fn.get("description", ""), str):
            raise RequestError(f"'{name}': 'parameters' must be a JSON schema object and "
                               "'description' a string", name)
        seen.add(fn["name"])
    return v


def tool_choice(name, v):
    """"none", "auto", "required", or the name of the function to call."""
    if v in CHOICES:
        return v
    fn = v.get("function") if isinstance(v, dict) else None
    if isinstance(fn, dict) and v.get("type") == "function" and isinstance(fn.get("name"), str) \
            and set(v) == {"type", "function"} and set(fn) == {"name"}:
        return fn["name"]
    raise RequestError(f"'{name}' must be none, auto, required or {{'type': 'function', "
                       "'function': {'name'}}", name)


__all__ = ["MAX_MESSAGES", "messages", "tool_choice", "tools"]
