"""A tokenizer.json checked before the tokenizers library reads it, and the bounds it gives.

A file from a stranger may carry a tokenizer whose normalizer, pre-tokenizer or decoder
expands text without bound (``Replace`` chained on itself, a regex replace matching the
empty string), a charsmap that leads the library out of bounds, a padding to a billion
tokens, or components nested deep enough to overflow its stack: the library aborts the
process (SIGABRT, SIGSEGV, or the kernel's OOM kill) rather than raising. So the JSON is
walked first: every component must be one this module knows, each gets the most it can
grow a text (characters out per character in, multiplied along a Sequence), and a file
whose worst case passes MAX_GROWTH, or that breaks a limit below, is refused with one line
naming the field. Padding and truncation are dropped (a prompt is never padded or cut, as
transformers' plain call does). The bounds returned let the tokenizer refuse, before the
library runs, a text or a list of ids whose worst-case output passes the limits.
"""

import json
from dataclasses import dataclass

from mlxgraph.interpreter.text.charsmap_check import CharsmapError, charsmap_growth
from mlxgraph.schema.errors import Error

MAX_GROWTH = 256  # worst-case tokens per character (and decoded characters per character)
MAX_NESTING = 32  # components within components
MAX_PATTERN_CHARS = 4096  # a Replace or Split pattern
MAX_TOKEN_CHARS = 4096  # the longest token string
MAX_WORDPIECE_WORD = 1024  # WordPiece's max_input_chars_per_word (its work is quadratic)
MAX_SPECIAL_IDS = 1024  # ids a post-processor adds

# Characters out per character in, at most (Unicode's own worst cases: NFKC expands U+FDFA
# to 18 characters, NFD to 4, case mappings to 3; a byte-level map makes a character of
# each UTF-8 byte; BertNormalizer spaces CJK, decomposes and lowercases: 3 * 4 * 3).
_NORMALIZERS = {"NFC": 3, "NFD": 4, "NFKC": 18, "NFKD": 18, "Lowercase": 3, "Strip": 1,
                "StripAccents": 1, "Nmt": 1, "ByteLevel": 4, "BertNormalizer": 36}
_PRE_TOKENIZERS = {"Whitespace": 1, "WhitespaceSplit": 1, "BertPreTokenizer": 1,
                   "Digits": 1, "Punctuation": 1, "CharDelimiterSplit": 1,
                   "UnicodeScripts": 1}
_DECODERS = {"ByteFallback": 1, "Fuse": 1, "Strip": 1, "Metaspace": 1, "ByteLevel": 1,
             "WordPiece": 1, "CTC": 1}
_PROCESSORS = {"RobertaProcessing", "BertProcessing", "ByteLevel"}


class TokenizerCheckError(Error, ValueError):
    """The tokenizer.json is refused (the message names the field and why)."""


@dataclass(frozen=True)
class TokenizerBounds:
    """What one character can become: ``growth`` tokens at most when encoded; a decoded
    id at most ``longest_token + 2`` characters times ``decode_growth``."""

    growth: int
    decode_growth: int
    longest_token: int
    regex: bool = False  # a pattern of the file's own runs in Oniguruma (time: see tools/)


def check_tokenizer_json(text: str) -> tuple[str, TokenizerBounds]:
    """The JSON to hand to the library (padding and truncation dropped) and its bounds.

    Raises:
        TokenizerCheckError: not a JSON object, or a component refused (one line).
    """
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TokenizerCheckError(f"tokenizer.json is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise TokenizerCheckError("tokenizer.json is not a JSON object with a model")
    doc["padding"] = doc["truncation"] = None
    normalizer = _component(doc.get("normalizer"), "normalizer", _normalizer)
    pre = _component(doc.get("pre_tokenizer"), "pre_tokenizer", _pre_tokenizer)
    model, tokens = _model(doc["model"])
    _component(doc.get("post_processor"), "post_processor", _processor)
    decode = _component(doc.get("decoder"), "decoder", _decoder)
    added = doc.get("added_tokens") or []
    if not isinstance(added, list):
        raise TokenizerCheckError("tokenizer.json added_tokens is not a list")
    for i, tok in enumerate(added):
        content = tok.get("content") if isinstance(tok, dict) else None
        if not isinstance(content, str) or not content:
            raise TokenizerCheckError(f"tokenizer.json added_tokens[{i}] has no content")
        tokens.append(content)
    longest = max((len(t) for t in tokens if isinstance(t, str)), default=1)
    if longest > MAX_TOKEN_CHARS:
        raise TokenizerCheckError(f"tokenizer.json has a token of {longest:,} characters "
                                  f"(at most {MAX_TOKEN_CHARS})")
    growth = normalizer * pre * model
    for what, g in (("encoding", growth), ("the decoder", decode)):
        if g > MAX_GROWTH:
            raise TokenizerCheckError(f"tokenizer.json: {what} can turn one character into "
                                      f"{g:,} (more than {MAX_GROWTH})")
    regex = _has_regex(doc.get("normalizer")) or _has_regex(doc.get("pre_tokenizer"))
    return json.dumps(doc), TokenizerBounds(growth, decode, longest, regex)


def _has_regex(node) -> bool:
    if isinstance(node, dict):
        return "Regex" in node or any(_has_regex(v) for v in node.values())
    return isinstance(node, list) and any(_has_regex(v) for v in node)


def _component(node, path, rule, depth=0) -> int:
    """The growth of one component (None: absent, 1)."""
    if node is None:
        return 1
    if depth > MAX_NESTING:
        raise TokenizerCheckError(f"tokenizer.json {path}: nested deeper than {MAX_NESTING}")
    if not isinstance(node, dict) or not isinstance(node.get("type"), str):
        raise TokenizerCheckError(f"tokenizer.json {path}: not a component with a type")
    kind = node["type"]
    if kind == "Sequence":
        key = {"normalizer": "normalizers", "pre_tokenizer": "pretokenizers",
               "post_processor": "processors", "decoder": "decoders"}[path.split(".")[0]]
        parts = node.get(key)
        if not isinstance(parts, list):
            raise TokenizerCheckError(f"tokenizer.json {path}.{key} is not a list")
        growth = 1
        for i, part in enumerate(parts):
            growth *= _component(part, f"{path}.{key}[{i}]", rule, depth + 1)
            growth = min(growth, MAX_GROWTH + 1)  # past the limit is refused anyway
        return growth
    return rule(node, kind, f"{path} ({kind})")


def _text(node, key, where) -> str:
    value = node.get(key)
    if not isinstance(value, str):
        raise TokenizerCheckError(f"tokenizer.json {where}: {key} is not a string")
    return value


def _pattern(node, where) -> tuple:
    """(pattern text, is a regex) of a Replace or Split."""
    p = node.get("pattern")
    if not isinstance(p, dict) or len(p) != 1 or not isinstance(next(iter(p.values())), str):
        raise TokenizerCheckError(f"tokenizer.json {where}: pattern is not "
                                  '{"String": ...} or {"Regex": ...}')
    (kind, text), = p.items()
    if kind not in ("String", "Regex") or not text or len(text) > MAX_PATTERN_CHARS:
        raise TokenizerCheckError(f"tokenizer.json {where}: pattern must be a String or Regex "
                                  f"of 1 to {MAX_PATTERN_CHARS} characters")
    return text, kind == "Regex"


def _replace(node, where, per_token=False) -> int:
    pattern, regex = _pattern(node, where)
    content = len(_text(node, "content", where))
    if regex:  # it may match the empty string: n + 1 matches in n characters
        return (2 if per_token else 1) * (1 + content) + content
    return max(1, -(-content // len(pattern)))


def _normalizer(node, kind, where) -> int:
    if kind in _NORMALIZERS:
        return _NORMALIZERS[kind]
    if kind == "Replace":
        return _replace(node, where)
    if kind == "Prepend":  # once per piece between added tokens: at most once a character
        return 1 + len(_text(node, "prepend", where))
    if kind == "Precompiled":
        try:
            return charsmap_growth(node.get("precompiled_charsmap"))
        except CharsmapError as e:
            raise TokenizerCheckError(f"tokenizer.json {where}: {e}") from None
    raise TokenizerCheckError(f"tokenizer.json {where}: not a normalizer mlxgraph knows")


def _pre_tokenizer(node, kind, where) -> int:
    if kind in _PRE_TOKENIZERS:
        return _PRE_TOKENIZERS[kind]
    if kind == "Split":
        _pattern(node, where)
        return 1
    if kind == "FixedLength":
        length = node.get("length")
        if not isinstance(length, int) or length < 1:
            raise TokenizerCheckError(f"tokenizer.json {where}: length is not a positive int")
        return 1
    if kind == "ByteLevel":  # each UTF-8 byte a character, a space before each piece
        return 8 if node.get("add_prefix_space", True) else 4
    if kind == "Metaspace":
        if len(_text(node, "replacement", where)) != 1:
            raise TokenizerCheckError(f"tokenizer.json {where}: replacement is not one "
                                      "character")
        return 1 if node.get("prepend_scheme") == "never" else 2
    raise TokenizerCheckError(f"tokenizer.json {where}: not a pre-tokenizer mlxgraph knows")


def _processor(node, kind, where) -> int:
    if kind == "TemplateProcessing":
        specials = node.get("special_tokens") or {}
        ids = sum(len(s.get("ids") or ()) for s in specials.values() if isinstance(s, dict)) \
            if isinstance(specials, dict) else MAX_SPECIAL_IDS + 1
        pieces = sum(len(node.get(k) or ()) for k in ("single", "pair"))
        if ids + pieces > MAX_SPECIAL_IDS:
            raise TokenizerCheckError(f"tokenizer.json {where}: adds more than "
                                      f"{MAX_SPECIAL_IDS} tokens")
        return 1
    if kind in _PROCESSORS:
        return 1
    raise TokenizerCheckError(f"tokenizer.json {where}: not a post-processor mlxgraph knows")


def _decoder(node, kind, where) -> int:
    if kind in _DECODERS:
        return _DECODERS[kind]
    if kind == "Replace":  # a regex here would run on every token decoded, unkillable
        if _pattern(node, where)[1]:
            raise TokenizerCheckError(f"tokenizer.json {where}: a Regex pattern in a "
                                      "decoder (a String one only)")
        return _replace(node, where, per_token=True)
    if kind == "BPEDecoder":  # an empty suffix is replaced between every two characters
        return 1 if node.get("suffix", "</w>") else 2
    raise TokenizerCheckError(f"tokenizer.json {where}: not a decoder mlxgraph knows")


def _model(model) -> tuple[int, list]:
    """(tokens per character at most, the vocabulary's token strings)."""
    kind = model.get("type")
    vocab = model.get("vocab")
    if kind == "Unigram" or (kind is None and isinstance(vocab, list)):
        tokens = [p[0] for p in vocab if isinstance(p, list) and p] \
            if isinstance(vocab, list) else []
    else:
        tokens = list(vocab) if isinstance(vocab, dict) else []
    if kind not in ("BPE", "Unigram", "WordPiece", "WordLevel", None):
        raise TokenizerCheckError(f"tokenizer.json model ({kind}): not a model mlxgraph knows")
    words = model.get("max_input_chars_per_word", 0)
    if not isinstance(words, int) or words > MAX_WORDPIECE_WORD:
        raise TokenizerCheckError(f"tokenizer.json model: max_input_chars_per_word {words} "
                                  f"(at most {MAX_WORDPIECE_WORD})")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if isinstance(model.get(key), str):
            tokens.append(model[key] * 2)  # added to a token
    return (4 if model.get("byte_fallback") else 1), tokens


__all__ = ["MAX_GROWTH", "TokenizerBounds", "TokenizerCheckError", "check_tokenizer_json"]
