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
Chat templates render with jinja2 (interpreter/text/chat_template.py) and the result is
encoded without special tokens, as ``apply_chat_template`` does (no second BOS).
"""

import codecs

from mlxgraph.interpreter.errors import TokenizerError
from mlxgraph.interpreter.text.hf_tokenizer import HFTokenizer
from mlxgraph.schema.tokenizer_files import TokenizerFilesError, read_tokenizer_folder


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
