"""One chunk of the embedded-text fuzz, run in its own process by tests/test_fuzz_runtime.py.

    python tests/fuzz_text_worker.py SEED FIRST COUNT PROGRESS_FILE

Each case mutates a graph's embedded tokenizer files: tokenizer.json (a valid one of four
kinds with fields replaced by odd values, components spliced in, nesting, text cut or
flipped) and the chat template (a real one edited character by character, or pieces of
loops, operators, filters and methods with odd arguments put together), then loads the
tokenizer (every fourth case from a graph file through ``mlxgraph.load``), encodes,
decodes, streams and applies the template (deadline 0.2 s). The only exceptions allowed are
TokenizerError and GraphFormatError; anything else is counted by type with its first case.
A crash or a hang kills this process: the last case started is in PROGRESS_FILE.
"""

import base64
import copy
import json
import random
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parent))

from hostile_tokenizers import CHARSMAP, base  # noqa: E402
from serve_helpers import TEMPLATE  # noqa: E402
from test_template_limits import ORDINARY  # noqa: E402

import mlxgraph  # noqa: E402
from mlxgraph import GraphFormatError  # noqa: E402
from mlxgraph.interpreter.text.chat_template import TemplateLimits  # noqa: E402
from mlxgraph.interpreter.text.tokenizer import TokenizerError, load_tokenizer  # noqa: E402

DOCUMENTED = (TokenizerError, GraphFormatError)
LIMITS = TemplateLimits(seconds=0.2)
ODD = [0, -1, 1, 10**9, 2**64, 1.5, float("nan"), "", "x" * 5000, "\u2581", None, True, [],
       {}, [[[]]], {"type": "Sequence"}, "\ud800".encode("utf-8", "surrogatepass").decode(
           "utf-8", "replace")]
PATTERNS = ["a", " ", "", "a*", "(a|a)+$", "\\s+", "(?=a)", "[", "\\p{L}+", "x" * 5000]


def documents() -> list:
    """Four valid tokenizer.json documents: byte-fallback BPE, byte-level BPE, a Unigram
    with a Precompiled charsmap and Metaspace, a WordPiece with BertNormalizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    out = [base()]
    bl = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate("abcdehlo ")}, merges=[]))
    bl.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    bl.decoder = decoders.ByteLevel()
    out.append(json.loads(bl.to_str()))
    uni = Tokenizer(models.Unigram([("<unk>", 0.0), ("▁", -1.0), ("a", -2.0), ("b", -2.0)],
                                   0, True))
    uni.normalizer = normalizers.Precompiled(base64.b64decode(CHARSMAP))
    uni.pre_tokenizer = pre_tokenizers.Metaspace()
    uni.decoder = decoders.Metaspace()
    out.append(json.loads(uni.to_str()))
    wp = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer()
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece()
    out.append(json.loads(wp.to_str()))
    return out


def _component(rng):
    kind = rng.choice(["Replace", "Prepend", "Precompiled", "Split", "Sequence", "NFKC",
                       "ByteLevel", "Metaspace", "Strip", "Mystery"])
    if kind == "Replace":
        key = rng.choice(["String", "Regex"])
        return {"type": kind, "pattern": {key: rng.choice(PATTERNS)},
                "content": "a" * rng.choice([0, 1, 2, 50, 1000])}
    if kind == "Prepend":
        return {"type": kind, "prepend": "x" * rng.choice([1, 10, 300])}
    if kind == "Precompiled":
        blob = bytearray(base64.b64decode(CHARSMAP))
        for _ in range(rng.randrange(1, 4)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        return {"type": kind, "precompiled_charsmap": base64.b64encode(blob).decode()}
    if kind == "Split":
        return {"type": kind, "pattern": {"Regex": rng.choice(PATTERNS)},
                "behavior": "Isolated", "invert": False}
    if kind == "Sequence":
        return {"type": kind, "normalizers": [_component(rng) for _ in range(3)]}
    return {"type": kind}


def _nodes(doc, path=()):
    yield path, doc
    items = doc.items() if isinstance(doc, dict) else (
        enumerate(doc) if isinstance(doc, list) else ())
    for k, v in items:
        if isinstance(v, (dict, list)) and len(path) < 6:
            yield from _nodes(v, path + (k,))


def tokenizer_json(rng, docs) -> str:
    doc = copy.deepcopy(rng.choice(docs))
    for _ in range(rng.randrange(1, 4)):
        nodes = [(p, n) for p, n in _nodes(doc) if n and len(str(n)) < 20000] or [((), doc)]
        path, node = rng.choice(nodes)
        key = rng.choice(list(node) if isinstance(node, dict) else range(len(node)))
        roll = rng.random()
        if roll < 0.45:
            node[key] = copy.deepcopy(rng.choice(ODD))  # shared, it could come to hold itself
        elif roll < 0.8:
            node[key] = _component(rng)
        elif isinstance(node, dict):
            del node[key]
        else:
            node.extend([node[key]] * rng.randrange(1, 50))
    text = json.dumps(doc)
    if rng.random() < 0.1:
        text = text[: rng.randrange(len(text))]
    return text


PIECES = [
    "{% for i in range(N) %}{{ i }}{% endfor %}", "{{ 'ab' * N }}", "{{ N ** N }}",
    "{{ '%0*d' % (N, 1) }}", "{{ '{:>N}'.format(1) }}", "{{ messages|tojson(indent=N) }}",
    "{{ 'x'|center(N) }}", "{{ ('a' * N).replace('a', 'bb') }}", "{{ [1, 2] * N }}",
    "{% macro f(n) %}{{ f(n - 1) if n else '' }}{% endmacro %}{{ f(N) }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(N) %}{% set ns.x = [ns.x, ns.x] %}"
    "{% endfor %}{{ ns.x|length }}", "{{ raise_exception('no') }}", "{{ 1 / 0 }}",
    "{{ messages[N]['content'] }}", "{{ ''.join(messages|map(attribute='role')) }}",
    "{{ lipsum(N) }}", "{{ x.y.z }}", "{{ 'a'|indent(N) }}", "{{ (N|string)|wordwrap(1) }}",
]


def template(rng) -> str:
    if rng.random() < 0.5:
        text = rng.choice(ORDINARY + [TEMPLATE])
        for _ in range(rng.randrange(1, 6)):
            i = rng.randrange(len(text) + 1)
            if rng.random() < 0.5:
                text = text[:i] + rng.choice("{}%()[]|'\"~*+-#.,0123456789 abx") + text[i:]
            else:
                text = text[:i] + text[i + 1:]
        return text
    n = lambda: str(rng.choice([0, 1, 3, 64, 1000, 10**5, 10**9, -5]))  # noqa: E731
    return "".join(rng.choice(PIECES).replace("N", n()) for _ in range(rng.randrange(1, 5)))


def one_case(rng, docs, folder: Path, through_file: bool) -> str:
    roll = rng.random()  # the tokenizer, the template, or both mutated
    chat = template(rng) if roll > 0.4 else rng.choice(ORDINARY)
    config = {"chat_template": chat, "bos_token": "<s>", "eos_token": "</s>"}
    tok_json = tokenizer_json(rng, docs) if roll < 0.4 or roll > 0.8 else json.dumps(
        rng.choice(docs))
    files = {"tokenizer.json": tok_json, "tokenizer_config.json": json.dumps(config)}
    try:
        if through_file:
            from tool_helpers import synthetic_graph

            path = synthetic_graph(folder / "fuzz.mlxg", tokenizer="embedded", vocab=300,
                                   files=files)
            tok = mlxgraph.load(path).tokenizer
        else:
            tok = load_tokenizer(SimpleNamespace(tokenizer="embedded", tokenizer_files=files))
        text = rng.choice(["hello ab", "", "a" * 3000, "①ＡLL café 😀", "\u0000 \t\n"])
        ids = tok.encode(text)
        tok.decode(ids + [rng.randrange(10**6)])
        stream = tok.stream_decoder(ids[:3])
        "".join(stream.add(i) for i in ids[:30]) + stream.flush()
        messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
        tok.apply_chat_template(messages, add_generation_prompt=True, limits=LIMITS)
    except DOCUMENTED as e:
        return f"refused:{type(e).__name__}"
    return "ran"


def main(seed: int, first: int, count: int, progress: str) -> dict:
    docs = documents()
    tally, undocumented = {}, {}
    with tempfile.TemporaryDirectory() as tmp, open(progress, "w") as prog:
        for case in range(first, first + count):
            rng = random.Random(f"{seed}-{case}")
            prog.seek(0)
            prog.write(f"{case:12d}\n")
            prog.flush()
            try:
                kind = one_case(rng, docs, Path(tmp), case % 4 == 0)
            except Exception as e:  # noqa: BLE001 - the point: anything undocumented is counted
                kind = f"undocumented:{type(e).__name__}"
                undocumented.setdefault(kind, f"case {case}: {e}"[:300])
            tally[kind] = tally.get(kind, 0) + 1
    return {"first": first, "count": count, "tally": tally, "undocumented": undocumented}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])))
