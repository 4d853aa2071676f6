"""Every transformers ``*ForCausalLM`` model type, exported from a tiny seeded config and
classified (issue 31's sweep):

- exact: the graph's logits within 1e-4 of transformers eager (relative to the logits'
  scale) over a prefill, the same prompt in chunks and greedy decode steps fed with the
  graph's own choices, and the same greedy tokens;
- refused: export raised an ``mlxgraph.Error`` of one line;
- failed: anything else (a multi-line or foreign error, a file that does not run, logits
  off, a timeout): a bug;
- unbuilt: transformers itself could not build or run the tiny config (not counted).

Each model runs in a forked child with a time limit. One command:

    python scripts/breadth_sweep.py [--types llama,gpt2] [--timeout 300] [--json out.json]
"""

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

PROMPT, CHUNK, DECODE, MAX_T, TOL = 20, 7, 8, 64, 1e-4
# Small enough to export in seconds, with MoE and head fields for the families that read them.
SMALL = dict(num_hidden_layers=2, decoder_layers=2, hidden_size=64, intermediate_size=128,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
             max_position_embeddings=128, num_experts=4, num_local_experts=4, n_routed_experts=4,
             num_experts_per_tok=2, moe_intermediate_size=32)
# Tried in turn: configs that derive head or expert sizes themselves reject some fields.
CANDIDATES = (SMALL, {k: v for k, v in SMALL.items() if k != "head_dim"},
              {k: SMALL[k] for k in ("num_hidden_layers", "decoder_layers", "vocab_size",
                                     "max_position_embeddings")})


# Per type, on top of each candidate: configs the generic one makes meaningless.
PER_TYPE = {
    # Dory's input, looped and output layers must add up to num_hidden_layers (the generic
    # config leaves 16 + -28 + 16 over 2 layers: each layer run twice on one cache).
    "dory": dict(num_hidden_layers=3, n_input_layers=1, n_output_layers=1),
    # HRM chains its layers in cycles: at the generic 0.25 weights transformers' own float32
    # forward is 2.4e-4 from its float64 one (ours 4.0e-4), so 1e-4 measures float32, not
    # the graph; at 0.1 float32 is well conditioned (tests/test_export_breadth.py too).
    "hrm_text": dict(initializer_range=0.1),
    # one global and one local layer (the default lists 24), a window the prompt passes
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]], window_size=8),
    # DBRX's attention and experts settings are sub-configs (rope_theta among them)
    "dbrx": dict(d_model=64, attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 1e4},
                 ffn_config={"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2}),
    # BART-style configs name their heads and widths per side
    **{t: dict(encoder_layers=2, d_model=64, decoder_attention_heads=4,
               encoder_attention_heads=4, decoder_ffn_dim=128, encoder_ffn_dim=128)
       for t in ("pegasus", "plbart", "mvp")},
}


def model_types() -> list:
    """Every model type transformers maps to a ``*ForCausalLM`` class, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(t for t, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
                  if isinstance(cls, str) and cls.endswith("ForCausalLM"))


def _rel(got, want) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def _reference(model, prompt):
    """transformers' greedy run: prefill logits, decode logits, tokens."""
    from transformers import DynamicCache

    n = prompt.shape[1]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(prompt, cache=cache, use_cache=True,
                    position_ids=torch.arange(n)[None]).logits
        tokens, decode = [int(out[0, -1].argmax())], []
        for i in range(DECODE):
            step = model(torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True,
                         position_ids=torch.tensor([[n + i]])).logits
            decode.append(step[0, -1].numpy())
            tokens.append(int(step[0, -1].argmax()))
    return out[0].numpy(), decode, tokens


def _ids(tokens):
    import mlx.core as mx

    return mx.array(np.asarray(tokens, dtype=np.int32).reshape(1, -1))


def _errors(path, prompt, reference) -> dict:
    """Relative errors of the graph over prefill, chunked prefill and decode; its tokens."""
    import mlxgraph

    prefill, decode, _ = reference
    n = prompt.shape[1]
    program = mlxgraph.load(path)
    session = program.session(capacity=128)
    logits = np.array(session.step(_ids(prompt), range(n)))[0]
    errs = {"prefill": _rel(logits, prefill), "decode": 0.0, "chunked": 0.0}
    tokens = [int(logits[-1].argmax())]
    for i, want in enumerate(decode):
        step = np.array(session.step(_ids([tokens[-1]]), [n + i]))[0, -1]
        errs["decode"] = max(errs["decode"], _rel(step, want))
        tokens.append(int(step.argmax()))
    session = program.session(capacity=128)
    for start in range(0, n, CHUNK):
        end = min(start + CHUNK, n)
        got = np.array(session.step(_ids(prompt[:, start:end]), range(start, end)))[0]
        errs["chunked"] = max(errs["chunked"], _rel(got, prefill[start:end]))
    return {"errors": errs, "tokens": tokens}


def _first_lines(text: str, n: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[:n])


def classify(model_type: str) -> dict:
    """One model type's row: {"type", "status", "detail"}."""
    import mlxgraph
    from mlxgraph.exporter import export
    from mlxgraph.exporter.builtins import build_model, make_config

    row = {"type": model_type}
    prompt = torch.randint(4, 256, (1, PROMPT), generator=torch.Generator().manual_seed(5))
    for overrides in CANDIDATES:  # the first config transformers builds and runs
        try:
            config = make_config(model_type, **{**overrides, **PER_TYPE.get(model_type, {})})
            reference = _reference(build_model(config), prompt)
            break
        except Exception as e:  # transformers' own problem with this tiny config
            unbuilt = _first_lines(f"{type(e).__name__}: {e}", 1)
    else:
        return dict(row, status="unbuilt", detail=unbuilt)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.mlxg"
        try:
            export(build_model(config), path, max_seq_len=MAX_T)
        except mlxgraph.Error as e:
            text = str(e).strip()
            lines = len(text.splitlines())
            if lines == 1:
                return dict(row, status="refused", detail=text)
            return dict(row, status="failed",
                        detail=f"refusal of {lines} lines: {_first_lines(text)}")
        except Exception as e:
            return dict(row, status="failed", detail=_first_lines(f"{type(e).__name__}: {e}"))
        try:
            got = _errors(path, prompt.numpy(), reference)
        except Exception as e:
            return dict(row, status="failed",
                        detail=_first_lines(f"runs: {type(e).__name__}: {e}"))
    worst = max(got["errors"].values())
    same = got["tokens"] == reference[2]
    errs = ", ".join(f"{k} {v:.1e}" for k, v in got["errors"].items())
    if worst <= TOL and same:
        return dict(row, status="exact", detail=errs)
    return dict(row, status="failed",
                detail=f"WRONG: {errs}" + ("" if same else ", greedy tokens differ"))


def _child(model_type, queue):
    warnings.filterwarnings("ignore")  # deprecations of the oracle's own API: noise here
    try:
        queue.put(classify(model_type))
    except BaseException as e:  # noqa: BLE001 - anything is a row, never a hang
        queue.put({"type": model_type, "status": "failed",
                   "detail": _first_lines(f"{type(e).__name__}: {e}")})


def run_one(model_type: str, timeout: float) -> dict:
    """classify() in a forked child, killed after ``timeout`` seconds."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(model_type, queue))
    start = time.monotonic()
    proc.start()
    try:
        row = queue.get(timeout=timeout)
    except Exception:
        row = {"type": model_type, "status": "failed", "detail": f"timeout after {timeout:.0f} s"}
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if proc.exitcode not in (0, None) and "status" not in row:
        row = {"type": model_type, "status": "failed", "detail": f"crashed ({proc.exitcode})"}
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


def summary(rows) -> dict:
    counts = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts


def markdown(rows) -> str:
    """The rows as a markdown table, failures first, then refusals, unbuilt, exact."""
    order = {"failed": 0, "refused": 1, "unbuilt": 2, "exact": 3}
    lines = ["| model type | class | detail |", "|---|---|---|"]
    for row in sorted(rows, key=lambda r: (order[r["status"]], r["type"])):
        detail = row["detail"].replace("|", "\\|")[:160]
        lines.append(f"| {row['type']} | {row['status']} | {detail} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", help="comma-separated model types (default: all)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per model")
    parser.add_argument("--json", help="write the rows here as JSON")
    parser.add_argument("--table", nargs="+", metavar="JSON",
                        help="print these runs' rows (a later file's row of a type wins) as a "
                             "markdown table and their counts; run nothing")
    args = parser.parse_args(argv)
    if args.table:
        merged = {}
        for name in args.table:
            merged.update({row["type"]: row for row in json.loads(Path(name).read_text())})
        rows = list(merged.values())
        print(markdown(rows))
        print(_counts_line(rows, ""))
        return 0
    import transformers

    transformers.logging.set_verbosity_error()
    types = args.types.split(",") if args.types else model_types()
    rows = []
    for model_type in types:
        row = run_one(model_type, args.timeout)
        rows.append(row)
        print(f"{row['type']:24s} {row['status']:8s} {row['seconds']:6.1f}s  {row['detail']}",
              flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print(_counts_line(rows, f"transformers {transformers.__version__}, "))
    return 1 if summary(rows).get("failed") else 0


def _counts_line(rows, prefix: str) -> str:
    counts = summary(rows)
    return (f"{prefix}{len(rows)} model types: "
            + ", ".join(f"{counts.get(k, 0)} {k}" for k in ("exact", "refused", "failed",
                                                             "unbuilt")))


if __name__ == "__main__":
    sys.exit(main())
