"""Per-token log-probs through the output head, a chunk of tokens at a time.

A vocabulary of 151,936 makes [tokens x vocabulary] the largest tensor of a training step by far: at 512-token
completions and 32 sequences, one fp32 copy is 10 GB, and a plain `log_softmax(logits / T)` holds three or
four of them for the backward pass. Here the head runs on a chunk of hidden states at a time, in fp32, and
each chunk is checkpointed: the forward keeps only the chunk's hidden states [c x H], and the backward
recomputes the chunk's logits, so the step never holds more than one chunk's [c x vocabulary] tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

CHUNK_BYTES = 128 * 2**20  # one chunk's fp32 logits; the chunk's backward holds about three such tensors


def chunk_tokens(vocab_size: int, budget_bytes: int = CHUNK_BYTES) -> int:
    """Tokens per chunk so that one chunk's fp32 logits take at most `budget_bytes` (at least one token)."""
    return max(1, int(budget_bytes) // (4 * max(1, int(vocab_size))))


def _chunk_logprobs(hidden: Tensor, targets: Tensor, head: Callable[[Tensor], Tensor], temperature: float) -> Tensor:
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def head_logprobs(hidden: Tensor, targets: Tensor, head: Callable[[Tensor], Tensor], temperature: float = 1.0,
                  chunk: int = 1024) -> Tensor:
    """log softmax(head(hidden) / T)[target] per row of `hidden` [T, H] -> fp32 [T].

    With gradients on, each chunk is recomputed in the backward pass (non-reentrant checkpoint), so what the
    graph keeps is the hidden states, not the logits. The values equal one `log_softmax` over all rows.
    """
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32)
    out = []
    for s in range(0, hidden.shape[0], max(1, int(chunk))):
        h, t = hidden[s : s + chunk], targets[s : s + chunk]
        if torch.is_grad_enabled():
            out.append(checkpoint(_chunk_logprobs, h, t, head, temperature, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(h, t, head, temperature))
    return torch.cat(out)


def logits_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0, chunk: int = 1024) -> Tensor:
    """The same from logits the model computed itself [T, V] (models whose head cannot be run on its own):
    the fp32 copy and the division by T are made a chunk at a time."""
    out = [_chunk_logprobs(logits[s : s + chunk], targets[s : s + chunk], lambda x: x, temperature)
           for s in range(0, logits.shape[0], max(1, int(chunk)))]
    return torch.cat(out) if out else logits.new_zeros(0, dtype=torch.float32)
