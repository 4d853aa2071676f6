"""Benchmark process: greedy generation with llama.cpp (llama-cpp-python) on a GGUF file.

    python benchmarks/engines/llama_cpp_engine.py --model M.gguf --prompt-ids 1,2,3 --new-tokens 128

The prompt in one ``eval`` (llama.cpp's prefill, one batch), then one ``eval`` per token,
the next token the argmax of the last logits, as mlxgraph's loop does (EOS ignored).
As its users run it: one thread per core (llama.cpp's own tools' advice; mlxgraph uses every
core too) and OpenMP's default wait policy (the orchestrators drop ``OMP_WAIT_POLICY`` from
the environment they pass on). Its threads spin between products: fast on a quiet machine,
slow on a loaded one; the benchmarks report the load average instead of slowing the peer.
An extra labelled row may set the policy on purpose (quantized_bench --llama-cpp-passive).
"""

import os
import sys

from common import emit, parse_args, run_all


def main() -> int:
    """Run the benchmark and print the result line."""
    args = parse_args()
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    threads = os.cpu_count() or 1
    llm = Llama(model_path=args.model, n_ctx=len(args.prompt) + args.new_tokens + 8,
                n_batch=max(512, len(args.prompt)), n_threads=threads,
                n_threads_batch=threads, verbose=False)

    def last_logits():
        # llama-cpp-python keeps no scores without logits_all: read llama.cpp's own buffer.
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))

    def once(prompt, n, timer):
        llm.reset()
        llm.eval(prompt)
        for i in range(n):
            tok = int(np.argmax(last_logits()))
            timer.token(tok)
            if i + 1 < n:
                llm.eval([tok])

    doc = run_all(once, args)
    policy = os.environ.get("OMP_WAIT_POLICY", "default")
    doc.update(engine="llama.cpp", threads=threads, omp_wait_policy=policy)
    emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
