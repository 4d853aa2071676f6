"""Recurrent-state and latent-attention models against mlx-lm on the same folders (issue 30).

    python benchmarks/state_bench.py [--models mamba2,qwen3_next,deepseek_v2]
        [--prompt 256] [--new-tokens 48] [--runs 2] [--json]

Three shapes, seeded random weights at sizes this machine holds: a Mamba-2 (SSD scan and
its conv state in every layer), a Qwen3-Next (three gated-delta layers to one attention
layer, 32 routed experts top-4 and a shared expert) and a DeepSeek-V2-Lite layout at a
sixth of its width (multi-head latent attention, YaRN, 64 routed experts top-6 and two
shared, the first layer dense). Each folder is written once by transformers (a torch
process), exported by ``mlxgraph export``, and run by both engines' benchmark processes
(benchmarks/engines/: greedy, EOS ignored, a warm-up then ``--runs`` measured runs, the
best reported): prefill and decode tok/s, their ratios, the greedy tokens both chose,
and what one session holds after the prompt: recurrent state (with its kept snapshots)
and KV bytes per token. Exactness against transformers is the tests' claim
(tests/test_state_space.py, test_recurrent_state.py, test_latent_attention.py); here the
two engines are compared with each other.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "out" / "bench" / "state"
ENGINES = HERE / "engines"
RESULT = "RESULT "
VOCAB = 4096

# name -> (transformers model_type, config keywords), ~30-120M parameters each.
MODELS = {
    "mamba2": ("mamba2", dict(
        vocab_size=VOCAB, hidden_size=768, num_hidden_layers=12, state_size=64, head_dim=64,
        num_heads=24, expand=2, n_groups=1, conv_kernel=4, chunk_size=64,
        tie_word_embeddings=True)),
    "qwen3_next": ("qwen3_next", dict(
        vocab_size=VOCAB, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, intermediate_size=1024,
        linear_num_value_heads=8, linear_num_key_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, num_experts=32,
        num_experts_per_tok=4, moe_intermediate_size=256, shared_expert_intermediate_size=512,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        full_attention_interval=4, partial_rotary_factor=0.25, rope_theta=10000.0,
        max_position_embeddings=4096)),
    "deepseek_v2": ("deepseek_v2", dict(
        vocab_size=VOCAB, hidden_size=384, num_hidden_layers=6, num_attention_heads=16,
        num_key_value_heads=16, intermediate_size=1792, moe_intermediate_size=224,
        n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2,
        first_k_dense_replace=1, moe_layer_freq=1, kv_lora_rank=128, q_lora_rank=None,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, topk_method="greedy",
        n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False,
        max_position_embeddings=4096, rope_theta=10000.0,
        rope_scaling={"type": "yarn", "rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 1024, "beta_fast": 32,
                      "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707})),
}


def build(name: str, folder: Path) -> None:
    """Write ``folder``: the model's seeded random weights and a config both libraries read
    as the same model (a torch process; run by ``--build``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, kw = MODELS[name]
    kw = dict(kw)
    rope = kw.pop("rope_scaling", None)
    cfg = AutoConfig.for_model(model_type, **kw)
    if rope is not None:  # transformers 5 reads rope_parameters
        cfg.rope_parameters = {**{k: v for k, v in rope.items() if k != "type"},
                               "rope_theta": kw["rope_theta"]}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():  # transformers' init leaves some weights tiny: draw them all
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.5 / p.shape[-1] ** 0.5)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    path = folder / "config.json"
    saved = json.loads(path.read_text())
    # mlx-lm reads these at the top level (transformers 5 keeps some under rope_parameters).
    for key in ("rope_theta", "partial_rotary_factor", "mlp_only_layers",
                "decoder_sparse_step"):
        if key in kw:
            saved.setdefault(key, kw[key])
    if model_type == "mamba2":  # its mixer's width, which transformers derives
        saved.setdefault("intermediate_size", int(cfg.expand * cfg.hidden_size))
    if rope is not None:
        saved["rope_scaling"] = rope
    path.write_text(json.dumps(saved, indent=2))
    (folder / "bench_stamp.json").write_text(json.dumps(MODELS[name]))


def _run(argv: list, what: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"state_bench: {what} failed (exit {done.returncode}):\n"
                         f"{done.stderr[-2000:]}")
    return done.stdout


def _result(stdout: str) -> dict:
    line = [ln for ln in stdout.splitlines() if ln.startswith(RESULT)][-1]
    return json.loads(line[len(RESULT):])


def prepared(name: str) -> tuple[Path, Path]:
    """(folder, graph) of ``name``, built and exported unless already there."""
    folder, graph = OUT / f"hf-{name}", OUT / f"{name}.mlxg"
    stamp = folder / "bench_stamp.json"
    if not stamp.is_file() or json.loads(stamp.read_text()) != json.loads(
            json.dumps(MODELS[name])):
        _run([sys.executable, __file__, "--build", name, str(folder)], f"building {name}")
        graph.unlink(missing_ok=True)
    if not graph.is_file():
        _run([sys.executable, "-m", "mlxgraph", "export", str(folder), "-o", str(graph)],
             f"exporting {name}")
    return folder, graph


def state_figures(graph: Path, prompt: list) -> dict:
    """What one session holds after the prompt (a child process: mlxgraph alone)."""
    code = (
        "import json, sys, mlx.core as mx, mlxgraph\n"
        "p = mlxgraph.load(sys.argv[1]); ids = json.loads(sys.argv[2])\n"
        "s = p.session(capacity=len(ids) + 8)\n"
        "s.step(mx.array([ids], dtype=mx.int32), range(len(ids)), last_only=True)\n"
        "d = s.describe(); print('RESULT ' + json.dumps({\n"
        "  'state_bytes': d['state_bytes'], 'kv_bytes_per_token': d['bytes_per_token'],\n"
        "  'state_layers': sum('snapshot_bytes' in la for la in d['layers']),\n"
        "  'kv_layers': sum('snapshot_bytes' not in la for la in d['layers'])}))\n")
    return _result(_run([sys.executable, "-c", code, str(graph), json.dumps(prompt)],
                        "describing a session"))


def measure(name: str, prompt_len: int, new_tokens: int, runs: int) -> dict:
    """One model: both engines, one after the other, on the same folder and prompt."""
    folder, graph = prepared(name)
    prompt = [(i * 7919 + 13) % (VOCAB - 8) + 4 for i in range(prompt_len)]
    common = ["--prompt-ids", ",".join(map(str, prompt)), "--new-tokens", str(new_tokens),
              "--runs", str(runs)]
    ours = _result(_run([sys.executable, str(ENGINES / "mlxgraph_engine.py"), "--model",
                         str(graph), *common], f"mlxgraph on {name}"))
    peer = _result(_run([sys.executable, str(ENGINES / "mlx_lm_engine.py"), "--model",
                         str(folder), *common], f"mlx-lm on {name}"))
    agree = 0
    for a, b in zip(ours["tokens"], peer["tokens"]):
        if a != b:
            break
        agree += 1
    return {"model": name, "model_type": MODELS[name][0],
            "params": _params(folder), "prompt": prompt_len, "new_tokens": new_tokens,
            "mlxgraph": ours, "mlx_lm": peer,
            "prefill_ratio": ours["prefill_tps"] / peer["prefill_tps"],
            "decode_ratio": ours["decode_tps"] / peer["decode_tps"],
            "greedy_agree": agree, **state_figures(graph, prompt)}


def _params(folder: Path) -> int:
    index = folder / "model.safetensors"
    if not index.is_file():
        return 0
    header = index.open("rb")
    n = int.from_bytes(header.read(8), "little")
    meta = json.loads(header.read(n))
    total = 0
    for key, v in meta.items():
        if key != "__metadata__":
            size = 1
            for d in v["shape"]:
                size *= d
            total += size
    return total


def print_report(doc: dict) -> None:
    """The table (figures.py prints the --json document with this)."""
    print(f"prompt {doc['prompt']} tokens, {doc['new_tokens']} greedy tokens, best of "
          f"{doc['runs']} runs; load average {doc['load'][0]:.2f} -> {doc['load'][1]:.2f}")
    print(f"{'model':<12} {'params':>7} {'mlxgraph prefill/decode':>24} "
          f"{'mlx-lm prefill/decode':>22} {'prefill':>8} {'decode':>7} {'greedy':>7} "
          f"{'state B':>9} {'KV B/tok':>9}")
    for r in doc["results"]:
        ours, peer = r["mlxgraph"], r["mlx_lm"]
        print(f"{r['model']:<12} {r['params'] / 1e6:>6.0f}M "
              f"{ours['prefill_tps']:>12.1f} / {ours['decode_tps']:<9.1f} "
              f"{peer['prefill_tps']:>10.1f} / {peer['decode_tps']:<9.1f} "
              f"{r['prefill_ratio']:>7.2f}x {r['decode_ratio']:>6.2f}x "
              f"{r['greedy_agree']:>3}/{len(ours['tokens']):<3} {r['state_bytes']:>9} "
              f"{r['kv_bytes_per_token']:>9}")


def main(argv=None) -> int:
    """Measure the chosen models, print the table (or --json)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--build", nargs=2, metavar=("NAME", "FOLDER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.build:
        build(args.build[0], Path(args.build[1]))
        return 0
    names = [n for n in args.models.split(",") if n]
    if unknown := [n for n in names if n not in MODELS]:
        print(f"state_bench: unknown model {unknown[0]!r} (known: {', '.join(MODELS)})",
              file=sys.stderr)
        return 2
    start = os.getloadavg()[0]
    results = []
    for name in names:
        print(f"state_bench: {name} ...", file=sys.stderr)
        results.append(measure(name, args.prompt, args.new_tokens, args.runs))
    doc = {"prompt": args.prompt, "new_tokens": args.new_tokens, "runs": args.runs,
           "load": [start, os.getloadavg()[0]], "results": results}
    if args.json:
        print(json.dumps(doc))
    else:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
