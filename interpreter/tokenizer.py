"""The tokenizer a graph file carries: byte-level for the built-in models, else the model's own.

A graph records its tokenizer in its metadata: ``tokenizer = "byte"`` for the built-in tiny
models (token id = the byte's value, vocabulary 256, BOS and EOS from the metadata), or
``tokenizer = "embedded"`` with the Hugging Face files embedded at export
(``metadata.tokenizer_files``: tokenizer.json, tokenizer_config.json, the chat template,
generation_config.json), read with the ``tokenizers`` library. ``transformers`` is never
imported: it imports torch, and the generate process must not run torch next to MLX's BLAS.
A folder named in a graph file is never read (a file from a stranger reads nothing outside
its own data); ``--tokenizer DIR`` (``load_tokenizer(..., folder=DIR)``) picks one explicitly.

BOS follows transformers 5: with a tokenizer.json, its post-processor alone decides which
special tokens ``encode`` adds; ``add_bos_token`` / ``add_eos_token`` in
tokenizer_config.json are ignored (transformers drops them when tokenizer.json exists).
Chat templates render with jinja2 (interpreter/chat_template.py) and the result is
encoded without special tokens, as ``apply_chat_template`` does (no second BOS).
"""

import codecs
import json

from mlxgraph.interpreter.chat_template import render_chat
from mlxgraph.schema.tokenizer_files import TokenizerFilesError, read_tokenizer_folder


class TokenizerError(Exception):
    """The graph's tokenizer cannot be loaded, or the text cannot be encoded with it."""


def _json(files: dict, name: str, origin: str) -> dict:
    if name not in files:
        return {}
    try:
        value = json.loads(files[name])
    except ValueError as e:
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


class ByteTokenizer:
    """Token id = byte value (UTF-8); ``bos`` (when >= 0) starts every prompt.

    Args:
        vocab_size: the model's vocabulary (bytes must fit in it).
        bos: the BOS id, or -1 for none.
        specials: ids that are not bytes (BOS, EOS); decoding skips them.
    """

    name = "byte"
    chat_template = None
    generation_eos_ids = ()

    def __init__(self, vocab_size: int, bos: int = -1, specials=()):
        self.vocab_size, self.bos = int(vocab_size), int(bos)
        self.specials = frozenset(int(s) for s in specials) | (
            {self.bos} if self.bos >= 0 else set()
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """UTF-8 bytes of ``text``, after BOS.

        Raises:
            TokenizerError: a byte outside the vocabulary, or one that is a special id.
        """
        ids = list(text.encode("utf-8"))
        if ids and max(ids) >= self.vocab_size:
            raise TokenizerError(
                f"byte {max(ids)} of the prompt is outside the model's vocabulary "
                f"of {self.vocab_size}"
            )
        clash = sorted(self.specials.intersection(ids))
        if clash:
            raise TokenizerError(
                f"the prompt contains byte {clash[0]}, which this model uses as a special token"
            )
        return ([self.bos] if self.bos >= 0 and add_special_tokens else []) + ids

    def decode(self, ids) -> str:
        """Text of ``ids``, special ids skipped."""
        dec = self.stream_decoder()
        return "".join(dec.add(t) for t in ids) + dec.flush()

    def apply_chat_template(
        self, messages, add_generation_prompt: bool = True, **extra
    ) -> list[int]:
        """Raises TokenizerError: the byte tokenizer has no chat template."""
        raise TokenizerError("the graph's byte-level tokenizer has no chat template")

    def token_id(self, token: str) -> int | None:
        """The id of a one-byte token, else None."""
        raw = token.encode("utf-8")
        return raw[0] if len(raw) == 1 else None

    def stream_decoder(self, context=()) -> "_ByteStream":
        """A fresh incremental decoder (``context``: ids already shown, unused for bytes)."""
        return _ByteStream(self)


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

        self.name = origin
        if "tokenizer.json" not in files:
            raise TokenizerError(f"{origin} tokenizer: no tokenizer.json")
        try:
            self._tok = Tokenizer.from_str(files["tokenizer.json"])
        except Exception as e:  # noqa: BLE001 - the library raises plain Exceptions
            raise TokenizerError(f"{origin} tokenizer: cannot load tokenizer.json ({e})") from None
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

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, with the tokenizer's special tokens (BOS) unless told not to."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids) -> str:
        """Text of ``ids``, special tokens skipped."""
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        """The id of a token of the vocabulary (e.g. '<|eot_id|>'), else None."""
        return self._tok.token_to_id(token)

    def apply_chat_template(
        self, messages, add_generation_prompt: bool = True, **extra
    ) -> list[int]:
        """Token ids of the conversation rendered with the chat template, as transformers'
        ``apply_chat_template(messages, add_generation_prompt=..., tokenize=True)`` gives them.

        Raises:
            TokenizerError: no chat template, or it fails to render (its own message).
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
        )
        return self.encode(text, add_special_tokens=False)

    def stream_decoder(self, context=()) -> "_TextStream":
        """A fresh incremental decoder; ``context`` are ids already shown (so the first new
        token's leading space comes out as in a whole decode)."""
        return _TextStream(self._tok, context)


class _ByteStream:
    """``add(id) -> new text`` ('' while a character is partial) and ``flush() -> rest``."""

    def __init__(self, tok: ByteTokenizer):
        self._tok = tok
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token: int) -> str:
        if token in self._tok.specials or not 0 <= token < 256:
            return ""
        return self._utf8.decode(bytes([token]))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class _TextStream:
    """tokenizers' own DecodeStream (it holds back incomplete characters and keeps the
    spacing a whole decode gives), behind the same add / flush interface; ``flush`` gives
    what it still holds (an incomplete character at the very end decodes to U+FFFD, as a
    whole decode gives it)."""

    def __init__(self, tok, context=()):
        from tokenizers.decoders import DecodeStream

        self._tok = tok
        self._context = list(context)[-8:]
        self._stream = DecodeStream(ids=self._context or None, skip_special_tokens=True)
        self._ids, self._emitted = [], []

    def add(self, token: int) -> str:
        self._ids.append(int(token))
        piece = self._stream.step(self._tok, int(token)) or ""
        self._emitted.append(piece)
        return piece

    def flush(self) -> str:
        emitted = "".join(self._emitted)
        base = self._tok.decode(self._context, skip_special_tokens=True)
        full = self._tok.decode(self._context + self._ids, skip_special_tokens=True)
        tail = (
            full[len(base) :]
            if full.startswith(base)
            else self._tok.decode(self._ids, skip_special_tokens=True)
        )
        rest = tail[len(emitted) :] if tail.startswith(emitted) else ""
        self._emitted.append(rest)
        return rest


def load_tokenizer(metadata, folder=None):
    """The tokenizer of a graph: ``folder`` when given, else the one the graph carries.

    Args:
        metadata: the graph's ModelInfo (tokenizer, tokenizer_files, vocab_size, bos/eos ids).
        folder: a Hugging Face folder that overrides the graph's tokenizer (--tokenizer DIR).
    Returns:
        a ByteTokenizer or HFTokenizer.
    Raises:
        TokenizerError: none recorded, or an older graph that names a folder (never read).
    """
    if folder is not None:
        try:
            return HFTokenizer(read_tokenizer_folder(folder), str(folder))
        except TokenizerFilesError as e:
            raise TokenizerError(str(e)) from None
    kind = (metadata.tokenizer or "").strip()
    if kind == "byte":
        return ByteTokenizer(metadata.vocab_size, metadata.bos_token_id, metadata.eos_token_ids)
    files = dict(getattr(metadata, "tokenizer_files", {}) or {})
    if files:
        return HFTokenizer(files, "embedded")
    if not kind:
        raise TokenizerError("the graph carries no tokenizer; use --prompt-ids or --tokenizer DIR")
    # Older exports recorded the exporting machine's folder: a path from a file is never read.
    raise TokenizerError(
        "the graph names a tokenizer folder instead of carrying its tokenizer "
        "(an older export); pass --tokenizer DIR, or export again"
    )


__all__ = ["ByteTokenizer", "HFTokenizer", "TokenizerError", "load_tokenizer"]
