"""Write a local Hugging Face Llama folder with seeded random weights (a torch process).

    python benchmarks/engines/make_hf_folder.py OUT_DIR \
        --config '{"hidden_size": 256, ...}' [--seed 0]

The weights come from transformers' own initialisation under ``torch.manual_seed``. The
config carries ``rope_theta`` both under ``rope_parameters`` (how transformers 5 reads
it) and at the top level (how mlx-lm's llama reads it); with only one of them the two
libraries would silently run different models. A ``bench_stamp.json`` records what the
folder was built from, so an unchanged folder is reused.
"""

import argparse
import json
import sys
from pathlib import Path


def build(out: Path, config: dict, seed: int, dtype: str = "float32") -> None:
    """Create ``out`` from ``config`` (LlamaConfig keywords) with weights seeded by ``seed``,
    saved in ``dtype``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**config)
    model = LlamaForCausalLM(cfg).to(getattr(torch, dtype)).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    path = out / "config.json"
    saved = json.loads(path.read_text())
    theta = (saved.get("rope_parameters") or {}).get(
        "rope_theta", config.get("rope_theta", 10000.0)
    )
    saved["rope_theta"] = theta
    saved.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": theta})
    path.write_text(json.dumps(saved, indent=2))


def main(argv=None) -> int:
    """Build the folder unless its stamp says it is already built from the same config."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--config", required=True, help="LlamaConfig keywords as JSON")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32", help="the saved weights' torch dtype")
    args = ap.parse_args(argv)
    out = Path(args.out)
    stamp = {"config": json.loads(args.config), "seed": args.seed}
    if args.dtype != "float32":  # float32 folders keep their stamps (and are reused)
        stamp["dtype"] = args.dtype
    stamp_path = out / "bench_stamp.json"
    if stamp_path.is_file() and json.loads(stamp_path.read_text()) == stamp:
        print(f"{out}: up to date", file=sys.stderr)
        return 0
    build(out, stamp["config"], args.seed, args.dtype)
    stamp_path.write_text(json.dumps(stamp, indent=2))
    print(f"{out}: written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
