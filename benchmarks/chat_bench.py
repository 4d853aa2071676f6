"""What keeping one session buys a chat: a multi-turn conversation through
``mlxgraph.ChatSession`` (each turn prefills only its new tokens) against the stateless way
(each turn a fresh session prefilling the whole history, as a server without a prompt cache
does), same graph, same greedy answers.

The graph is a synthetic Llama (seeded random weights, ``tests/synthetic_graphs.py``) carrying a
byte-level BPE tokenizer trained here with a ChatML-style chat template; no torch. Printed
per turn: tokens prefilled by each way and the turn's seconds; then the totals and the
ratio stateless / kept session. The answers of both ways are checked identical.

    .venv/bin/python benchmarks/chat_bench.py [--turns 6] [--hidden 256] [--layers 4] [--json]
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from mlxgraph.interpreter.native.blas import preload_blas

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
USER = (
    "Here is a paragraph about graphs, caches and models, repeated so that each turn carries a "
    "realistic amount of new text for the model to read before it answers. "
) * 3


def tokenizer_files() -> dict:
    """A trained byte-level BPE tokenizer with specials and a chat template, as file texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        show_progress=False,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([USER] * 20, trainer)
    config = {"bos_token": "<s>", "eos_token": "<|im_end|>", "chat_template": TEMPLATE}
    return {"tokenizer.json": tok.to_str(), "tokenizer_config.json": json.dumps(config)}


def build_graph(path: Path, hidden: int, layers: int) -> None:
    """The synthetic Llama with the tokenizer embedded."""
    # The synthetic builder is test support (tests/synthetic_graphs.py), not the package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from synthetic_graphs import llama

    spec = llama(
        layers=layers,
        hidden=hidden,
        heads=8,
        kv_heads=4,
        intermediate=hidden * 3,
        vocab=512,
        seed=0,
        max_context=8192,
        tied=False,
    )
    spec.metadata.tokenizer, spec.metadata.tokenizer_files = "embedded", tokenizer_files()
    spec.metadata.eos_token_ids = ()
    spec.write(path)


def kept(program, turns: int, answer: int) -> list:
    """(prefilled, seconds, answer) per turn, one session throughout."""
    from mlxgraph import ChatSession

    chat = ChatSession(
        program, program.tokenizer, program.session(), max_tokens=answer, ignore_eos=True
    )
    rows = []
    for _ in range(turns):
        t0 = time.perf_counter()
        last = list(chat.stream(USER))[-1]
        rows.append(
            (last.stats.prompt_tokens, time.perf_counter() - t0, chat.messages[-1]["content"])
        )
    return rows


def stateless(program, turns: int, answer: int, answers: list) -> list:
    """(prefilled, seconds, answer) per turn, a fresh session on the whole history each turn."""
    import mlxgraph

    messages, rows = [], []
    for i in range(turns):
        messages.append({"role": "user", "content": USER})
        t0 = time.perf_counter()
        result = mlxgraph.generate(program, list(messages), max_tokens=answer, ignore_eos=True)
        rows.append((result.stats.prompt_tokens, time.perf_counter() - t0, result.text))
        # The same history as the kept session's, so both ways see the same ids.
        messages.append({"role": "assistant", "content": answers[i]})
    return rows


def main(argv=None) -> int:
    """Run both ways and print the table (or --json)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--answer", type=int, default=32, help="tokens per answer (EOS ignored)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    blas = preload_blas()
    import mlxgraph

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chat.mlxg"
        build_graph(path, args.hidden, args.layers)
        program = mlxgraph.load(path)
        kept(program, 1, 4)  # warm-up
        a = kept(program, args.turns, args.answer)
        b = stateless(program, args.turns, args.answer, [r[2] for r in a])
    same = [x[2] for x in a] == [y[2] for y in b]
    doc = {
        "turns": [
            {
                "turn": i + 1,
                "kept_prefilled": x[0],
                "kept_seconds": x[1],
                "stateless_prefilled": y[0],
                "stateless_seconds": y[1],
            }
            for i, (x, y) in enumerate(zip(a, b))
        ],
        "kept_seconds": sum(x[1] for x in a),
        "stateless_seconds": sum(y[1] for y in b),
        "answers_identical": same,
        "blas": blas.describe(),
        "config": {"hidden": args.hidden, "layers": args.layers, "answer": args.answer},
    }
    doc["stateless_over_kept"] = doc["stateless_seconds"] / doc["kept_seconds"]
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0 if same else 1
    print(
        f"chat of {args.turns} turns, {args.answer}-token answers; "
        f"hidden {args.hidden}, {args.layers} layers; "
        f"BLAS {blas.describe()}"
    )
    print(f"{'turn':>4} {'kept: prefilled':>16} {'s':>7} {'stateless: prefilled':>21} {'s':>7}")
    for r in doc["turns"]:
        print(
            f"{r['turn']:>4} {r['kept_prefilled']:>16} {r['kept_seconds']:>7.3f} "
            f"{r['stateless_prefilled']:>21} {r['stateless_seconds']:>7.3f}"
        )
    print(
        f"total: kept {doc['kept_seconds']:.2f} s, stateless {doc['stateless_seconds']:.2f} s: "
        f"stateless / kept = {doc['stateless_over_kept']:.2f}x; answers identical: {same}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
