"""Benchmark process: greedy generation with transformers (torch eager, its default cache).

    python benchmarks/engines/transformers_engine.py --model FOLDER --prompt-ids 1,2,3 \
        --new-tokens 128

No BLAS preload here (torch brings its own, and OpenBLAS's threads would slow it). A
streamer timestamps each new token (reading it waits for the device); EOS is switched off
so exactly N tokens come out. ``--dtype`` and ``--device`` (cuda) serve the GPU benchmark.
"""

import sys

from common import emit, parse_args, run_all


def main() -> int:
    """Run the benchmark and print the result line."""
    args = parse_args()
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()

    class Stamp(BaseStreamer):
        def __init__(self, timer):
            self.timer, self.seen_prompt = timer, False

        def put(self, value):
            if not self.seen_prompt:  # the first put is the prompt itself
                self.seen_prompt = True
                return
            self.timer.token(int(value.reshape(-1)[0]))

        def end(self):
            pass

    def once(prompt, n, timer):
        config = GenerationConfig(
            max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        ids = torch.tensor([prompt], dtype=torch.long, device=args.device)
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                           streamer=Stamp(timer))

    doc = run_all(once, args)
    blas = f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    doc.update(engine="transformers", blas=blas, device=args.device, dtype=args.dtype)
    if args.device == "cuda":
        doc["peak_device_bytes"] = int(torch.cuda.max_memory_allocated())
    emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
