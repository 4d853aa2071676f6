"""Chat templates chosen by the user: a built-in by name, or a jinja2 file, used instead of
(or where there is no) template in the tokenizer.

Base models and graphs without a template can then chat, as llama.cpp's ``--chat-template``
allows. A template chosen here renders in this process under the same limits as a file's
(interpreter/text/chat_template.py); the text is encoded by the tokenizer itself (in its
worker process where it has one). Each built-in brings the stop strings that end its
assistant turn, so a base model does not go on to write the user's next line.
"""

from dataclasses import dataclass
from pathlib import Path

from mlxgraph.interpreter.text.chat_template import TemplateLimits, render_chat
from mlxgraph.interpreter.text.tokenizer import TokenizerError

_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# A transcript: the answer follows "Assistant:" (the model's own leading space kept), and
# ends where the model starts the user's next line.
_PLAIN = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + '\\n\\n' }}"
    "{% elif m['role'] == 'user' %}{{ 'User: ' + m['content'] + '\\n' }}"
    "{% else %}{{ 'Assistant:' + m['content'] + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


@dataclass(frozen=True)
class ChatTemplate:
    """A template to render conversations with: its name (for messages), jinja2 text, and
    the stop strings that end an assistant turn."""

    name: str
    text: str
    stops: tuple = ()


BUILTIN = {
    "chatml": ChatTemplate("the built-in chatml template", _CHATML, ("<|im_end|>",)),
    "plain": ChatTemplate("the built-in plain template", _PLAIN, ("\nUser:",)),
}


def chat_template(spec: str) -> ChatTemplate:
    """The template ``spec`` names: a built-in (chatml, plain) or a jinja2 file.

    Raises:
        ValueError: neither a built-in name nor a readable UTF-8 file within the size a
            chat template may have.
    """
    if spec in BUILTIN:
        return BUILTIN[spec]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"{spec!r} is neither a built-in chat template "
                         f"({', '.join(BUILTIN)}) nor a file")
    limit = TemplateLimits().source_chars
    if path.stat().st_size > 4 * limit:
        raise ValueError(f"{spec}: larger than a chat template may be ({limit:,} characters)")
    try:
        return ChatTemplate(f"the chat template {path.name}", path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{spec}: cannot read ({e})") from None


class TemplatedTokenizer:
    """``tokenizer`` with ``template`` as its chat template; everything else is its own."""

    def __init__(self, tokenizer, template: ChatTemplate):
        self._inner, self.template = tokenizer, template
        self.chat_template, self.chat_template_name = template.text, template.name

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def with_inner(self, tokenizer) -> "TemplatedTokenizer":
        """The same template over another instance of the tokenizer (serve's workers)."""
        return TemplatedTokenizer(tokenizer, self.template)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, limits=None,
                            **extra) -> list[int]:
        """Token ids of the conversation rendered with the chosen template.

        Raises:
            TokenizerError: the template fails or passes its limits, or the encode fails.
        """
        variables = {**getattr(self._inner, "special_tokens", {}), **extra}
        text = render_chat(self.template.text, messages, add_generation_prompt, variables,
                           error=TokenizerError, name=self.template.name, limits=limits)
        return self._inner.encode(text, add_special_tokens=False)


__all__ = ["BUILTIN", "ChatTemplate", "TemplatedTokenizer", "chat_template"]
