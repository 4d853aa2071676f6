"""A Hugging Face fast tokenizer from its files, checked before the library reads them.

tokenizer.json goes through interpreter/text/tokenizer_check.py first (the library aborts the
process on some hostile files instead of raising), with padding and truncation dropped;
every call into the library is bounded first (a text whose worst-case token count, or a
list of ids whose worst-case text, passes the limits below is refused), and whatever the
library still raises, a Rust panic (pyo3's PanicException, a BaseException) included, is a
TokenizerError naming the tokenizer. The chat template renders under limits
(interpreter/text/chat_template.py). See interpreter/text/tokenizer.py for the conventions (BOS,
special tokens, the chat template's files).
"""

import json

from mlxgraph.interpreter.errors import TokenizerError
from mlxgraph.interpreter.text.chat_template import render_chat
from mlxgraph.interpreter.text.tokenizer_check import TokenizerCheckError, check_tokenizer_json

MAX_ENCODE_TOKENS = 4 << 20  # worst-case tokens of one encode (about 160 bytes each)
MAX_DECODE_CHARS = 64 << 20  # worst-case characters of one decode


def _json(files: dict, name: str, origin: str) -> dict:
    if name not in files:
        return {}
    try:
        value = json.loads(files[name])
    except (ValueError, RecursionError) as e:
        raise TokenizerError(f"{origin} tokenizer: {name} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{origin} tokenizer: {name} is not a JSON object")
    return value


def _token_text(value) -> str | None:
    # tokenizer_config writes a special token as "<s>" or as {"content": "<s>", ...}.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _id_list(value) -> tuple:
    if isinstance(value, bool) or value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()



class HFTokenizer:
    """A Hugging Face fast tokenizer from its files (tokenizer.json and friends).

    Args:
        files: {file name: text}, as read_tokenizer_folder or a graph's metadata give them.
        origin: where the files come from, for messages.
    Raises:
        TokenizerError: no tokenizer.json, or a file that cannot be read.
    """

    def __init__(self, files: dict, origin: str):
        from tokenizers import Tokenizer

        self.name, self.files = origin, dict(files)
        if "tokenizer.json" not in files:
            raise TokenizerError(f"{origin} tokenizer: no tokenizer.json")
        try:
            checked, self.bounds = check_tokenizer_json(files["tokenizer.json"])
        except TokenizerCheckError as e:
            raise TokenizerError(f"{origin} tokenizer: {e}") from None
        self._tok = self._library("load tokenizer.json", Tokenizer.from_str, checked)
        config = _json(files, "tokenizer_config.json", origin)
        special_map = _json(files, "special_tokens_map.json", origin)
        self.special_tokens = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            text = _token_text(config.get(key, special_map.get(key)))
            if text is not None:
                self.special_tokens[key] = text
        self.chat_template = self._chat_template(files, config, origin)
        generation = _json(files, "generation_config.json", origin)
        self.generation_eos_ids = _id_list(generation.get("eos_token_id"))

    def _chat_template(self, files: dict, config: dict, origin: str) -> str | None:
        if "chat_template.jinja" in files:
            self.chat_template_name = f"the {origin} chat template (chat_template.jinja)"
            return files["chat_template.jinja"]
        source = _json(files, "chat_template.json", origin)
        where = "chat_template.json" if "chat_template" in source else "tokenizer_config.json"
        self.chat_template_name = f"the {origin} chat template ({where})"
        template = source.get("chat_template", config.get("chat_template"))
        if isinstance(template, list):  # named templates: the "default" one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return template if isinstance(template, str) and template else None

    def _library(self, what: str, call, *args, **kwargs):
        """``call(*args, **kwargs)``; whatever the library raises (a Rust panic included) is
        a TokenizerError."""
        try:
            return call(*args, **kwargs)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - pyo3's PanicException is a BaseException
            text = " ".join(str(e).split())[:300]
            raise TokenizerError(f"the {self.name} tokenizer cannot {what}: "
                                 f"{type(e).__name__}: {text}") from None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, with the tokenizer's special tokens (BOS) unless told not to.

        Raises:
            TokenizerError: a text whose worst case passes MAX_ENCODE_TOKENS, or the library
                failed.
        """
        worst = len(text) * self.bounds.growth
        if worst > MAX_ENCODE_TOKENS:
            raise TokenizerError(
                f"a text of {len(text):,} characters is more than the {self.name} tokenizer "
                f"may encode at once (up to {self.bounds.growth} tokens a character; at most "
                f"{MAX_ENCODE_TOKENS:,} tokens in the worst case)")
        return self._library("encode", self._tok.encode, text,
                             add_special_tokens=add_special_tokens).ids

    def decode(self, ids) -> str:
        """Text of ``ids``, special tokens skipped. Raises TokenizerError (as encode)."""
        ids = list(ids)
        self.check_decode(len(ids))
        return self._library("decode", self._tok.decode, ids, skip_special_tokens=True)

    def check_decode(self, count: int) -> None:
        """Raises TokenizerError when ``count`` ids could decode past MAX_DECODE_CHARS."""
        b = self.bounds
        if count * (b.longest_token + 2) * b.decode_growth > MAX_DECODE_CHARS:
            raise TokenizerError(
                f"{count:,} ids are more than the {self.name} tokenizer may decode at once "
                f"(at most {MAX_DECODE_CHARS:,} characters in the worst case)")

    def token_id(self, token: str) -> int | None:
        """The id of a token of the vocabulary (e.g. '<|eot_id|>'), else None."""
        return self._library("look up a token", self._tok.token_to_id, token)

    def apply_chat_template(
        self, messages, add_generation_prompt: bool = True, limits=None, **extra
    ) -> list[int]:
        """Token ids of the conversation rendered with the chat template, as transformers'
        ``apply_chat_template(messages, add_generation_prompt=..., tokenize=True)`` gives them.

        ``limits``: what the render may spend (TemplateLimits; default its defaults).

        Raises:
            TokenizerError: no chat template, or it fails to render (its own message) or
                passes its limits.
        """
        if self.chat_template is None:
            raise TokenizerError(f"the {self.name} tokenizer has no chat template")
        text = render_chat(
            self.chat_template,
            messages,
            add_generation_prompt,
            {**self.special_tokens, **extra},
            error=TokenizerError,
            name=self.chat_template_name,
            limits=limits,
        )
        return self.encode(text, add_special_tokens=False)

    def stream_decoder(self, context=()) -> "_TextStream":
        """A fresh incremental decoder; ``context`` are ids already shown (so the first new
        token's leading space comes out as in a whole decode)."""
        return _TextStream(self, context)


class _TextStream:
    """tokenizers' own DecodeStream (it holds back incomplete characters and keeps the
    spacing a whole decode gives), behind the same add / flush interface; ``flush`` gives
    what it still holds (an incomplete character at the very end decodes to U+FFFD, as a
    whole decode gives it)."""

    def __init__(self, tok: HFTokenizer, context=()):
        from tokenizers.decoders import DecodeStream

        self._tok = tok
        self._context = list(context)[-8:]
        self._stream = tok._library("decode", DecodeStream, ids=self._context or None,
                                    skip_special_tokens=True)
        self._ids, self._emitted = [], []

    def add(self, token: int) -> str:
        self._ids.append(int(token))
        piece = self._tok._library("decode", self._stream.step, self._tok._tok, int(token))
        self._emitted.append(piece or "")
        return piece or ""

    def flush(self) -> str:
        emitted = "".join(self._emitted)
        base = self._tok.decode(self._context)
        full = self._tok.decode(self._context + self._ids)
        tail = full[len(base) :] if full.startswith(base) else self._tok.decode(self._ids)
        rest = tail[len(emitted) :] if tail.startswith(emitted) else ""
        self._emitted.append(rest)
        return rest


__all__ = ["MAX_DECODE_CHARS", "MAX_ENCODE_TOKENS", "HFTokenizer"]
