"""A local Hugging Face chat model folder, its transformers references, and its export.

    build(folder, graph) -> references     (python tests/chat_folder.py FOLDER GRAPH prints
                                            them as one JSON line)

The folder
holds a tiny seeded-random Llama, a byte-level BPE tokenizer trained here with the
``tokenizers`` library (specials, ``add_bos_token`` only in tokenizer_config.json, a
ChatML-style chat template that starts with the BOS token), and a generation_config.json
whose EOS list is [config EOS, <a token greedy decoding reaches>] (the Llama-3-Instruct
pattern: the end-of-turn token is listed only there). The references: the prompt ids
``apply_chat_template(..., add_generation_prompt=True)`` gives, ``generate``'s greedy ids
with the folder's generation_config (stopping at that EOS), and a three-turn conversation
(full-history template ids and greedy answers each turn).
"""

import json
import sys
from pathlib import Path

SPECIALS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Once upon a time there was a tiny model that liked to chat.",
    "Hello! How are you today? I am fine, thank you.",
    "héllo wörld ✓ — naïve café",
]
PROMPTS = ["Hello", "Tell me a story about a tiny model."]
STEPS = 24
CHAT_SYSTEM, CHAT_TURNS, CHAT_STEPS = "Be brief.", ["Hello", "Tell me a story.", "Thank you!"], 12


def write_folder(folder: Path) -> None:
    """Tokenizer files and a seeded random Llama (no generation_config EOS list yet)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 30, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "add_bos_token": True,
                "bos_token": "<s>",
                "eos_token": "<|im_end|>",
                "pad_token": "<pad>",
                "chat_template": CHAT_TEMPLATE,
            }
        )
    )
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).eval().save_pretrained(folder)


def references(folder: Path) -> dict:
    """Prompt ids and greedy ids of transformers, before and after the EOS list is written."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    out = {"prompts": {}, "plain_ids": tok("Hello")["input_ids"]}
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    first = None
    for text in PROMPTS:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        with torch.inference_mode():
            gen = model.generate(
                torch.tensor([ids]),
                max_new_tokens=STEPS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        greedy = gen[0, len(ids) :].tolist()
        out["prompts"][text] = {"prompt_ids": ids, "free_ids": greedy}
        if first is None:
            # The end-of-turn token: one greedy decoding reaches at step 6 and not before.
            first = next(t for i, t in enumerate(greedy) if i >= 5 and t not in greedy[:i])
    eos = [model.config.eos_token_id, first]
    (folder / "generation_config.json").write_text(
        json.dumps(
            {"bos_token_id": model.config.bos_token_id, "eos_token_id": eos, "pad_token_id": 0}
        )
    )
    out["eos"] = eos
    model = AutoModelForCausalLM.from_pretrained(folder).eval()  # now with the EOS list
    for ref in out["prompts"].values():
        ref["greedy_ids"] = _greedy(model, ref["prompt_ids"], STEPS)
    out["chat"] = chat_reference(tok, model)
    return out


def _greedy(model, ids, steps):
    import torch

    with torch.inference_mode():
        gen = model.generate(
            torch.tensor([ids]), max_new_tokens=steps, do_sample=False, pad_token_id=0
        )
    return gen[0, len(ids) :].tolist()


def chat_reference(tok, model) -> list:
    """A conversation as transformers runs it: each turn the full history through the
    template, greedy answers (the folder's EOS list), decoded into the next turn's history."""
    messages, turns = [{"role": "system", "content": CHAT_SYSTEM}], []
    for text in CHAT_TURNS:
        messages.append({"role": "user", "content": text})
        ids = tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        answer = _greedy(model, ids, CHAT_STEPS)
        reply = tok.decode(answer, skip_special_tokens=True)
        turns.append({"ids": ids, "answer_ids": answer, "text": reply})
        messages.append({"role": "assistant", "content": reply})
    return turns


def build(folder: Path, graph: Path) -> dict:
    """Write the folder, compute its references, export it with `mlxgraph export`.

    torch's global random state is left as it was (the weights are drawn from seed 0).

    Raises:
        RuntimeError: the export command failed (its exit code).
    """
    import torch

    from mlxgraph.tools.cli import main as cli

    with torch.random.fork_rng():
        write_folder(folder)
    refs = references(folder)
    code = cli(["export", str(folder), "-o", str(graph), "--json"])
    if code:
        raise RuntimeError(f"mlxgraph export {folder} exited {code}")
    return refs


def main() -> int:
    print(json.dumps(build(Path(sys.argv[1]), Path(sys.argv[2]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
