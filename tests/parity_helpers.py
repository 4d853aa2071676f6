"""What the parity tests share: the Hugging Face greedy oracle and the error measure."""

import mlx.core as mx
import numpy as np
import torch

# step_batch rows against the same sessions stepped alone, relative to the logits' scale
# (docs/architecture.md#batched-steps): only the batched products' rounding differs.
BATCH_ROW_BOUND = 1e-5

def rel_err(got, want) -> float:
    """max |got - want| relative to the largest |want| (the logits' scale)."""
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def ids(tokens) -> mx.array:
    """Token ids as the interpreter's [1, T] int32 input."""
    return mx.array(np.asarray(tokens, dtype=np.int32).reshape(1, -1))


def hf_greedy_reference(model, prompt, decode_steps: int):
    """HF greedy decoding with its own DynamicCache and default attention.

    Args:
        model: the Hugging Face causal LM (the oracle).
        prompt: [1, T] token ids (torch).
        decode_steps: single-token steps after the prefill.
    Returns:
        (prefill logits [T, V], [logits of each decode step], greedy tokens: the prefill's
        choice, then each decode step's).
    """
    from transformers import DynamicCache

    n = prompt.shape[1]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(prompt, cache=cache, use_cache=True, position_ids=torch.arange(n)[None]).logits
        prefill = out[0].numpy()
        tokens, decode = [int(out[0, -1].argmax())], []
        for i in range(decode_steps):
            step = model(torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True,
                         position_ids=torch.tensor([[n + i]])).logits
            decode.append(step[0, -1].numpy())
            tokens.append(int(step[0, -1].argmax()))
    return prefill, decode, tokens


def mlxgraph_parity_errors(path, prompt, reference, chunk: int) -> dict:
    """Run a graph as the parity tests do and measure it against ``hf_greedy_reference``.

    A prefill of the whole prompt then greedy decode steps fed with the graph's own
    choices (identical tokens is part of the claim), and a second session prefilling the
    prompt in chunks of ``chunk``.
    Returns:
        {"prefill", "decode" (max over steps), "chunked": relative errors, "tokens": ours}.
    """
    import mlxgraph

    prefill, decode, _ = reference
    prompt = np.asarray(prompt)
    n = prompt.shape[1]
    program = mlxgraph.load(path)
    session = program.session(capacity=128)
    logits = np.array(session.step(ids(prompt), range(n)))[0]
    out = {"prefill": rel_err(logits, prefill), "decode": 0.0, "chunked": 0.0}
    tokens = [int(logits[-1].argmax())]
    for i, want in enumerate(decode):
        step = np.array(session.step(ids([tokens[-1]]), [n + i]))[0, -1]
        out["decode"] = max(out["decode"], rel_err(step, want))
        tokens.append(int(step.argmax()))
    session = program.session(capacity=128)
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        got = np.array(session.step(ids(prompt[:, start:end]), range(start, end)))[0]
        out["chunked"] = max(out["chunked"], rel_err(got, prefill[start:end]))
    out["tokens"] = tokens
    out["batched"], batched_tokens = batched_parity_error(program, prompt, reference)
    assert batched_tokens == tokens, "batched greedy tokens differ from the solo run's"
    return out


def batched_parity_error(program, prompt, reference) -> tuple:
    """The prompt's row stepped in batches beside two other sessions (another prompt and a
    single token, each then decoding its own greedy choice), against ``reference``.

    Returns:
        (max relative error over the prefill and every decode step, our greedy tokens).
    """
    prefill, decode, _ = reference
    prompt = np.asarray(prompt)
    n = prompt.shape[1]
    main, other, lone = (program.session(capacity=128) for _ in range(3))
    side = prompt[:, ::-1][:, : max(1, n - 4)]
    rows = [(main, ids(prompt), range(n)), (other, ids(side), range(side.shape[1])),
            (lone, ids([[5]]), [0])]
    logits = [np.array(x)[0] for x in program.step_batch(rows)]
    err = rel_err(logits[0], prefill)
    tokens = [int(logits[0][-1].argmax())]
    nexts = [int(x[-1].argmax()) for x in logits[1:]]
    for i, want in enumerate(decode):
        rows = [(main, ids([tokens[-1]]), [n + i])]
        rows += [(s, ids([t]), [s.length]) for s, t in zip((other, lone), nexts)]
        got = [np.array(x)[0, -1] for x in program.step_batch(rows)]
        err = max(err, rel_err(got[0], want))
        tokens.append(int(got[0].argmax()))
        nexts = [int(x.argmax()) for x in got[1:]]
    return err, tokens


def batched_vs_solo_error(program, prompt, decode_steps: int) -> float:
    """How far step_batch rows are from the same sessions stepped alone: three sessions
    (the prompt, its reverse, one token) prefilled in one batch then decoding their greedy
    tokens together, against three sessions doing the same steps one by one.

    Returns:
        the max over rows and steps of max |batched - solo| / max |solo| (per row).
    """
    prompt = np.asarray(prompt)
    rows = [prompt, prompt[:, ::-1][:, : max(1, prompt.shape[1] - 4)], np.array([[5]])]
    batched = [program.session(capacity=128) for _ in rows]
    solo = [program.session(capacity=128) for _ in rows]
    steps = [(ids(r), range(r.shape[1])) for r in rows]
    worst = 0.0
    for _ in range(decode_steps + 1):
        together = program.step_batch([(s, t, p) for s, (t, p) in zip(batched, steps)])
        alone = [s.step(t, p) for s, (t, p) in zip(solo, steps)]
        nexts = []
        for got, want in zip(together, alone):
            want = np.array(want)[0]
            worst = max(worst, rel_err(np.array(got)[0], want))
            nexts.append(int(want[-1].argmax()))
        steps = [(ids([t]), [s.length]) for s, t in zip(solo, nexts)]
    return worst
