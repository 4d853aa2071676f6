"""Chat templates: the tokenizer's jinja2 template rendered as transformers renders it.

Same environment as transformers' ``apply_chat_template``: a sandbox (a template comes with
a file from anyone), ``trim_blocks`` and ``lstrip_blocks``, the loop-controls extension, a
``tojson`` filter that does not escape HTML, and the ``raise_exception`` and
``strftime_now`` globals; the special tokens (``bos_token``, ``eos_token``, ...) are
template variables.
"""

import json
from datetime import datetime
from functools import lru_cache


@lru_cache(maxsize=8)
def _compile(template: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render_chat(
    template: str, messages, add_generation_prompt: bool, variables: dict, error=ValueError
) -> str:
    """The conversation as text, rendered with ``template``.

    Args:
        template: the jinja2 chat template.
        messages: [{"role": ..., "content": ...}, ...].
        add_generation_prompt: end with the assistant turn's opening.
        variables: more template variables (special tokens).
        error: the exception type to raise.
    Raises:
        error: the template does not compile or fails to render (its message).
    """
    import jinja2

    try:
        compiled = _compile(template)
        return compiled.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.TemplateError as e:
        raise error(f"the chat template failed: {e}") from None


__all__ = ["render_chat"]
