"""Train `tiny-code`: a small Llama-architecture model of Python, on Python's own standard library.

Usage (from the repository root, with the export extras installed):

    .venv/bin/python scripts/train_tiny_code.py --out exporter/models/tiny-code
    .venv/bin/python scripts/train_tiny_code.py --list-corpus > scripts/tiny_code_corpus.txt

The corpus is the fixed list of standard-library files in scripts/tiny_code_corpus.txt
(split, sha256, bytes, path relative to the stdlib folder; `heldout` files are for
validation only). A different Python ships different files: the script reads the running
Python's stdlib, reports every file whose hash differs from the list, and refuses to train
unless --allow-mismatch. The committed model was trained with the Python named in its
model card; this script documents exactly how.

Steps: a byte-level BPE tokenizer (``tokenizers``) trained on the training files; each file
becomes ``<|endoftext|> + tokens``; random windows of the training stream train a
``LlamaForCausalLM`` with AdamW (warmup, cosine decay) for a fixed number of steps; the
held-out loss is reported in bits per UTF-8 byte. Deterministic for a given seed, torch
and thread count (one thread by default). Saves a Hugging Face folder: config.json,
model.safetensors (float16), tokenizer.json, tokenizer_config.json, generation_config.json,
training.json (arguments, loss curve, timings).
"""

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

from tiny_code_corpus import list_corpus, read_corpus, stdlib_root

# Before tokenizers is imported: its trainer must not depend on the thread count.
os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EOT = "<|endoftext|>"


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer of ``vocab_size`` tokens (``<|endoftext|>`` = id 0) on ``texts``.

    Every encoding starts with ``<|endoftext|>``, the token that opens each training file.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{EOT} $A",
                                                       special_tokens=[(EOT, 0)])
    return tok


def token_stream(tok, texts: list[str]):
    """All ``texts`` as one int64 tensor of token ids, each opened by ``<|endoftext|>``."""
    import torch

    ids = [i for enc in tok.encode_batch(texts) for i in enc.ids]
    return torch.tensor(ids, dtype=torch.long)


def token_bytes(tok):
    """A tensor of the UTF-8 byte count each token id stands for (0 for ``<|endoftext|>``)."""
    import torch
    from tokenizers import pre_tokenizers

    # ByteLevel's alphabet is 256 printable characters, one per byte value.
    counts = [0] * tok.get_vocab_size()
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    for token, i in tok.get_vocab().items():
        counts[i] = sum(1 for c in token if c in alphabet) if token != EOT else 0
    return torch.tensor(counts, dtype=torch.float64)


def build_model(args, vocab_size: int):
    """A freshly initialised LlamaForCausalLM of the requested size (seeded by the caller)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.seq_len, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, initializer_range=0.02,
    )
    return LlamaForCausalLM(config)


def heldout_bits_per_byte(model, stream, nbytes, seq_len: int, limit: int = 0) -> float:
    """Bits per byte of ``stream`` under ``model``: windows of ``seq_len`` tokens overlapping by
    one, so every token after the first is predicted once. ``limit`` > 0 uses that many windows."""
    import torch
    import torch.nn.functional as F

    total_bits, total_bytes = 0.0, 0.0
    starts = range(0, len(stream) - 1, seq_len)
    model.eval()
    with torch.no_grad():
        for n, s in enumerate(starts):
            if limit and n >= limit:
                break
            window = stream[s:s + seq_len + 1]
            logits = model(window[None, :-1]).logits[0].double()
            nll = F.cross_entropy(logits, window[1:], reduction="sum").item()
            total_bits += nll / math.log(2)
            total_bytes += nbytes[window[1:]].sum().item()
    model.train()
    return total_bits / total_bytes


def lr_at(step: int, progress: float, args) -> float:
    """Linear warmup over ``args.warmup`` steps, then cosine decay to a tenth of the peak as
    ``progress`` goes from 0 to 1."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def progress_at(step: int, seconds: float, args) -> float:
    """How far training is, 0..1: by steps, or, with --budget-minutes, by steps or wall time,
    whichever is further (a shared machine's speed varies; the schedule still ends annealed).
    Only the step schedule is reproducible bit for bit."""
    by_steps = (step - args.warmup) / max(1, args.steps - args.warmup)
    if not args.budget_minutes:
        return by_steps
    return max(by_steps, seconds / (60 * args.budget_minutes))


def train(args, model, train_ids, heldout, nbytes, log) -> list[dict]:
    """Train in place; returns the loss curve (train loss, held-out bits per byte on a sample)."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    curve, t0, running, done = [], time.perf_counter(), None, 0
    model.train()
    for step in range(args.steps):
        starts = torch.randint(0, len(train_ids) - args.seq_len - 1, (args.batch,), generator=gen)
        batch = torch.stack([train_ids[s:s + args.seq_len + 1] for s in starts.tolist()])
        progress = progress_at(step, time.perf_counter() - t0, args)
        if progress >= 1.0:
            log(f"wall budget of {args.budget_minutes} min reached after {step} steps")
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, progress, args)
        logits = model(batch[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        done = step + 1
        if done % args.eval_every == 0:
            curve.append(curve_point(model, done, t0, running, heldout, nbytes, args))
            log(json.dumps(curve[-1]))
    if not curve or curve[-1]["step"] != done:
        curve.append(curve_point(model, done, t0, running, heldout, nbytes, args))
        log(json.dumps(curve[-1]))
    return curve


def curve_point(model, steps: int, t0: float, running: float, heldout, nbytes, args) -> dict:
    """A loss curve point: steps done, seconds, smoothed train loss, held-out sample bpb."""
    bpb = heldout_bits_per_byte(model, heldout, nbytes, args.seq_len, limit=args.eval_windows)
    return {"step": steps, "seconds": round(time.perf_counter() - t0, 1),
            "train_loss": round(running, 4), "heldout_bpb_sample": round(bpb, 4)}


def save(out: Path, model, tok, report: dict) -> None:
    """The Hugging Face folder: float16 weights, tokenizer files, generation config, report."""
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=0, eos_token_id=0, pad_token_id=0).save_pretrained(out)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT,
                                   pad_token=EOT,
                                   model_max_length=model.config.max_position_embeddings)
    fast.save_pretrained(out)
    (out / "training.json").write_text(json.dumps(report, indent=1) + "\n")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="the model folder to write")
    p.add_argument("--list-corpus", action="store_true",
                   help="print the corpus list for this Python, exit")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="train even if the stdlib differs from the list")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=704)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-windows", type=int, default=40, help="held-out windows per curve point")
    p.add_argument("--budget-minutes", type=float, default=0.0,
                   help="wall budget of the training loop; the schedule anneals by it "
                   "(0 = steps only)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list_corpus:
        print("\n".join(list_corpus(stdlib_root())))
        return 0
    if args.out is None:
        raise SystemExit("--out is required")
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()

    def log(message):
        print(f"[{time.perf_counter() - t_start:7.1f}s] {message}", flush=True)

    splits, bad = read_corpus(stdlib_root())
    if bad:
        print(f"{len(bad)} listed file(s) missing or different in {stdlib_root()}: "
              f"{', '.join(bad[:8])}", file=sys.stderr)
        if not args.allow_mismatch:
            raise SystemExit("refusing to train on a different corpus (--allow-mismatch to go on)")
    train_texts, heldout_texts = splits["train"], splits["heldout"]
    log(f"corpus: {len(train_texts)} train files, {len(heldout_texts)} held-out files "
        f"(Python {platform.python_version()})")
    tok = train_tokenizer(train_texts, args.vocab)
    train_ids, heldout_ids = token_stream(tok, train_texts), token_stream(tok, heldout_texts)
    nbytes = token_bytes(tok)
    log(f"tokenizer: {tok.get_vocab_size()} tokens; train {len(train_ids)} tokens "
        f"({nbytes[train_ids].sum().item() / len(train_ids):.2f} bytes/token), "
        f"held-out {len(heldout_ids)}")
    model = build_model(args, tok.get_vocab_size())
    params = sum(p.numel() for p in model.parameters())
    log(f"model: {params} parameters; {args.steps} steps of {args.batch} x {args.seq_len} tokens")
    t_train = time.perf_counter()
    curve = train(args, model, train_ids, heldout_ids, nbytes, log)
    train_seconds = time.perf_counter() - t_train
    bpb = heldout_bits_per_byte(model, heldout_ids, nbytes, args.seq_len)
    log(f"held-out: {bpb:.4f} bits per byte (float32, all {len(heldout_texts)} files); "
        f"training {train_seconds / 60:.1f} min")
    report = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "python": platform.python_version(), "torch": torch.__version__, "parameters": params,
              "train_tokens": len(train_ids), "heldout_tokens": len(heldout_ids),
              "steps_done": curve[-1]["step"],
              "tokens_seen": curve[-1]["step"] * args.batch * args.seq_len,
              "train_seconds": round(train_seconds, 1), "heldout_bits_per_byte": round(bpb, 4),
              "curve": curve}
    save(args.out, model, tok, report)
    log(f"saved {args.out} (total {time.perf_counter() - t_start:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
