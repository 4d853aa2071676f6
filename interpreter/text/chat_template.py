"""Chat templates: the tokenizer's jinja2 template rendered as transformers renders it,
under limits.

Same environment as transformers' ``apply_chat_template`` (interpreter/text/template_sandbox.py:
a sandbox, since a template comes with a file from anyone), and each render runs under a
Budget (interpreter/text/template_budget.py): units of work and allocation, a wall-clock
deadline, nested calls, and a cap on the template's own size. Whatever goes wrong (a
syntax error, ``raise_exception``, a limit, an exception of any type from the template's
code) is one ``error`` with one line that names the template.
"""

from functools import lru_cache

from mlxgraph.interpreter.text.template_budget import (
    Budget,
    TemplateLimits,
    deep_size,
    finished,
    running,
)


@lru_cache(maxsize=8)
def _compile(template: str):
    from mlxgraph.interpreter.text.template_sandbox import LimitedEnvironment

    return LimitedEnvironment().from_string(template)


def _one_line(e: BaseException) -> str:
    import jinja2

    text = " ".join(str(e).split())[:400] or "(no message)"
    return text if isinstance(e, jinja2.TemplateError) else f"{type(e).__name__}: {text}"


def render_chat(
    template: str,
    messages,
    add_generation_prompt: bool,
    variables: dict,
    error=ValueError,
    name: str = "the chat template",
    limits: TemplateLimits | None = None,
) -> str:
    """The conversation as text, rendered with ``template``.

    Args:
        template: the jinja2 chat template.
        messages: [{"role": ..., "content": ...}, ...].
        add_generation_prompt: end with the assistant turn's opening.
        variables: more template variables (special tokens).
        error: the exception type to raise.
        name: the template, for messages ("the embedded chat template").
        limits: what the render may spend (default TemplateLimits()).
    Raises:
        error: the template is too large, does not compile, fails to render or passes a
            limit; one line starting with ``name``.
    """
    limits = limits or TemplateLimits()
    if len(template) > limits.source_chars:
        raise error(f"{name} has {len(template):,} characters, more than the "
                    f"{limits.source_chars:,} a chat template may have")
    try:
        compiled = _compile(template)
    except Exception as e:  # noqa: BLE001 - syntax errors, RecursionError on deep nesting...
        raise error(f"{name} does not compile: {_one_line(e)}") from None
    context = {"messages": [dict(m) for m in messages],
               "add_generation_prompt": add_generation_prompt, **variables}
    budget = Budget(limits, deep_size(context, 1 << 62))
    token = running(budget)
    try:
        pieces = []
        for piece in compiled.generate(context):
            budget.charge(len(piece) + 16, "the rendered text")  # + a piece's own cost
            pieces.append(piece)
        return "".join(pieces)
    except Exception as e:  # noqa: BLE001 - whatever the template's code raised
        raise error(f"{name} failed: {_one_line(e)}") from None
    finally:
        finished(token)


__all__ = ["TemplateLimits", "render_chat"]
