"""Benchmark process: greedy generation with llama.cpp (llama-cpp-python) on a GGUF file.

    python benchmarks/engines/llama_cpp_engine.py --model M.gguf --prompt-ids 1,2,3 --new-tokens 128

The prompt in one ``eval`` (llama.cpp's prefill, one batch), then one ``eval`` per token,
the next token the argmax of the last logits, as mlxgraph's loop does (EOS ignored).
Threads: the CPU count up to 2, as mlxgraph's quantized kernel uses. OpenMP's threads wait
passively between products (``OMP_WAIT_POLICY=PASSIVE`` unless set): on a shared machine a
spinning thread holds a core another process needs, and llama.cpp's decode fell from ~490
to ~8 tok/s on tiny-code with the default (active) policy under load.
"""

import os
import sys

from common import emit, parse_args, run_all


def main() -> int:
    """Run the benchmark and print the result line."""
    args = parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before llama.cpp loads libgomp
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    threads = min(2, os.cpu_count() or 1)
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
    doc.update(engine="llama.cpp", threads=threads, omp_wait_policy=os.environ["OMP_WAIT_POLICY"])
    emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
