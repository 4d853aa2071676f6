"""What the parity tests share: the Hugging Face greedy oracle and the error measure."""

import mlx.core as mx
import numpy as np
import torch


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
