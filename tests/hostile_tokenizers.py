"""Hostile tokenizer.json files (each a mutation of a small valid one), and a runner that
takes them through HFTokenizer in this process:

    python tests/hostile_tokenizers.py PROGRESS_FILE

loads each, encodes and decodes a little, and prints one JSON line {case: outcome}; an
outcome is 'ok' or 'TokenizerError: <message>' (anything else is 'UNDOCUMENTED ...'). Run
in a subprocess with a memory limit (tests/test_tokenizer_limits.py): a case that crashes
the process or hangs is named by PROGRESS_FILE.
"""

import base64
import copy
import json
import struct
import sys
from pathlib import Path

CHARSMAP = (Path(__file__).parent / "data" / "spm_small_charsmap.b64").read_text().strip()


def base() -> dict:
    """A Llama-2-style tokenizer: Prepend + Replace normalizer, byte-fallback BPE."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for word in ("▁", "a", "b", "h", "e", "l", "o", "▁h", "el", "lo"):
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "h"), ("e", "l"), ("l", "o")],
                               byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return json.loads(tok.to_str())


def _replace(content, regex=False, pattern="a"):
    return {"type": "Replace", "pattern": {"Regex" if regex else "String": pattern},
            "content": content}


def _charsmap(mutate) -> dict:
    blob = bytearray(base64.b64decode(CHARSMAP))
    mutate(blob)
    return {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(blob).decode()}


def _nested(depth):
    node = {"type": "Lowercase"}
    for _ in range(depth):
        node = {"type": "Sequence", "normalizers": [node]}
    return node


def _set(path, value):
    def apply(doc):
        *keys, last = path
        for k in keys:
            doc = doc[k]
        doc[last] = value
    return apply


def _unit(index, value):
    return lambda blob: struct.pack_into("<I", blob, 4 + 4 * index, value)


CASES = {  # name -> (mutation of the base document, or raw text)
    "chained Replace": _set(["normalizer"], {"type": "Sequence", "normalizers": [
        _replace("a" * 100000), _replace("a" * 100000)]}),
    "regex Replace empty match": _set(["normalizer"], _replace("x" * 300, regex=True,
                                                               pattern="")),
    "regex Replace": _set(["normalizer"], _replace("x" * 300, regex=True, pattern="a*")),
    "empty String pattern": _set(["normalizer"], _replace("x", pattern="")),
    "Prepend long": _set(["normalizer"], {"type": "Prepend", "prepend": "x" * 1000}),
    "decoder chained Replace": _set(["decoder"], {"type": "Sequence", "decoders": [
        _replace("a" * 100000), _replace("a" * 100000)]}),
    "padding Fixed 10**9": _set(["padding"], {
        "strategy": {"Fixed": 10**9}, "direction": "Right", "pad_to_multiple_of": None,
        "pad_id": 0, "pad_type_id": 0, "pad_token": "<unk>"}),
    "truncation to 1": _set(["truncation"], {"direction": "Right", "max_length": 1,
                                             "strategy": "LongestFirst", "stride": 0}),
    "charsmap valid": _set(["normalizer"], _charsmap(lambda b: None)),
    "charsmap trie size huge": _set(["normalizer"], _charsmap(
        lambda b: struct.pack_into("<I", b, 0, 0xFFFFFFF0))),
    "charsmap trie size odd": _set(["normalizer"], _charsmap(
        lambda b: struct.pack_into("<I", b, 0, 6))),
    "charsmap root offset out": _set(["normalizer"], _charsmap(_unit(0, 5000 << 10))),
    "charsmap unit out": _set(["normalizer"], _charsmap(_unit(0, 0x3FFFFF << 10))),
    "charsmap strings not UTF-8": _set(["normalizer"], _charsmap(lambda b: b.extend(b"\xff"))),
    "charsmap not base64": _set(["normalizer"], {"type": "Precompiled",
                                                 "precompiled_charsmap": "%%%"}),
    "charsmap empty": _set(["normalizer"], {"type": "Precompiled",
                                            "precompiled_charsmap": ""}),
    "nested 40 deep": _set(["normalizer"], _nested(40)),
    "unknown normalizer": _set(["normalizer"], {"type": "Mystery"}),
    "component without type": _set(["pre_tokenizer"], {"kind": "Whitespace"}),
    "FixedLength 0": _set(["pre_tokenizer"], {"type": "FixedLength", "length": 0}),
    "Metaspace two chars": _set(["pre_tokenizer"], {"type": "Metaspace", "replacement": "ab",
                                                    "prepend_scheme": "always",
                                                    "split": True}),
    "WordPiece huge words": _set(["model", "max_input_chars_per_word"], 10**9),
    "token of 10**5 chars": _set(["model", "vocab", "x" * 100000], 9999),
    "post-processor 10**4 ids": _set(["post_processor"], {
        "type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1] * 10000,
                                               "tokens": ["<s>"] * 10000}}}),
    "added token empty": _set(["added_tokens"], [{"id": 1, "content": "", "special": True}]),
    "regex backtracking": _set(["pre_tokenizer"], {"type": "Split", "pattern": {
        "Regex": "(a|a)+$"}, "behavior": "Isolated", "invert": False}),
    "regex slow": _set(["pre_tokenizer"], {"type": "Split", "pattern": {
        "Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}),
    "decoder regex": _set(["decoder"], _replace("x", regex=True, pattern="a")),
    "model unknown": _set(["model", "type"], "Mystery"),
    "not JSON": "{not json",
    "a JSON list": "[1, 2]",
    "JSON nested 100000 deep": "[" * 100000 + "]" * 100000,
}


def document(name) -> str:
    case = CASES[name]
    if isinstance(case, str):
        return case
    doc = copy.deepcopy(base())
    case(doc)
    return json.dumps(doc)


def run_case(name) -> str:
    from mlxgraph.interpreter.text.hf_tokenizer import HFTokenizer
    from mlxgraph.interpreter.text.tokenizer import TokenizerError

    try:
        tok = HFTokenizer({"tokenizer.json": document(name)}, "hostile")
        ids = tok.encode("hello " * 200 + "a" * 1000 + "①ＡLL")
        tok.decode(ids)
        stream = tok.stream_decoder()
        "".join(stream.add(i) for i in ids[:20]) + stream.flush()
        return f"ok {len(ids)}"
    except TokenizerError as e:
        return f"TokenizerError: {e}"
    except BaseException as e:  # noqa: BLE001 - the point: name anything undocumented
        return f"UNDOCUMENTED {type(e).__name__}: {e}"


if __name__ == "__main__":
    results = {}
    with open(sys.argv[1], "w") as progress:
        for name in CASES:
            progress.seek(0)
            progress.write(f"{name:60s}\n")
            progress.flush()
            results[name] = run_case(name)
    print(json.dumps(results))
