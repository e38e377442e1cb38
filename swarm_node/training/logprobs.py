"""Per-token log-probs through the output head, a chunk of tokens at a time.

A vocabulary of 151,936 makes [tokens x vocabulary] the largest tensor of a training step by far: at 512-token
completions and 32 sequences, one fp32 copy is 10 GB, and a plain `log_softmax(logits / T)` with autograd
holds four or five of them for the backward pass. Here the head runs on a chunk of hidden states at a time,
and the chunk's log-prob is an autograd function of its own (`_ChunkLogProb`): its forward keeps the chunk's
hidden states, targets and log-normaliser, not the logits; its backward recomputes the chunk's logits once
and turns them into their gradient in place (softmax, minus the target's one-hot, times the incoming
gradient), then sends that through the head. A chunk costs about two [chunk x vocabulary] fp32 tensors at a
time, and only one chunk is alive.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

CHUNK_BYTES = 128 * 2**20  # one chunk's fp32 logits


def chunk_tokens(vocab_size: int, budget_bytes: int = CHUNK_BYTES) -> int:
    """Tokens per chunk so that one chunk's fp32 logits take at most `budget_bytes` (at least one token)."""
    return max(1, int(budget_bytes) // (4 * max(1, int(vocab_size))))


class _ChunkLogProb(torch.autograd.Function):
    """log softmax(head(h) / T)[target] for one chunk, with a backward that recomputes the logits once.

    The head's trainable parameters are inputs too, so their gradients take autograd's usual route
    (`torch.autograd.grad` sees them, a tied embedding sums both paths)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, targets: Tensor, head: Callable[[Tensor], Tensor],  # type: ignore[override]
                temperature: float, *params: Tensor) -> Tensor:
        logits = head(hidden).float()
        if temperature != 1.0:
            logits = logits / temperature
        lse = torch.logsumexp(logits, dim=-1)
        out = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
        ctx.save_for_backward(hidden, targets, lse, *params)
        ctx.head, ctx.temperature = head, temperature
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        hidden, targets, lse, *params = ctx.saved_tensors
        h = hidden.detach().requires_grad_(ctx.needs_input_grad[0])
        with torch.enable_grad():
            out = ctx.head(h)
        with torch.no_grad():
            g = out.float() if out.dtype != torch.float32 else out.detach()
            if ctx.temperature != 1.0:
                g.div_(ctx.temperature)
            g.sub_(lse[:, None]).exp_().mul_(-grad[:, None])  # d/dlogits of (logit[t] - lse) = onehot - softmax
            g.scatter_add_(-1, targets[:, None], grad[:, None].to(g.dtype))
            if ctx.temperature != 1.0:
                g.div_(ctx.temperature)
        wanted = [x for x, need in zip([h, *params], [ctx.needs_input_grad[0], *ctx.needs_input_grad[4:]],
                                       strict=True) if need]
        found = iter(torch.autograd.grad(out, wanted, g.to(out.dtype), allow_unused=True) if wanted else ())
        grads = [next(found) if need else None for need in [ctx.needs_input_grad[0], *ctx.needs_input_grad[4:]]]
        return grads[0], None, None, None, *grads[1:]


def _plain_logprobs(logits: Tensor, targets: Tensor, temperature: float) -> Tensor:
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def head_logprobs(hidden: Tensor, targets: Tensor, head: Callable[[Tensor], Tensor], temperature: float = 1.0,
                  chunk: int = 1024) -> Tensor:
    """log softmax(head(hidden) / T)[target] per row of `hidden` [T, H] -> fp32 [T], a chunk at a time.

    The values and gradients equal one `log_softmax` over all rows; the head's parameters get their
    gradient in the backward pass, as from a plain forward.
    """
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32)
    step = max(1, int(chunk))
    grad = torch.is_grad_enabled()
    params = [p for p in head.parameters() if p.requires_grad] if isinstance(head, torch.nn.Module) else []
    parts = [_ChunkLogProb.apply(hidden[s : s + step], targets[s : s + step], head, temperature, *params) if grad
             else _plain_logprobs(head(hidden[s : s + step]), targets[s : s + step], temperature)
             for s in range(0, hidden.shape[0], step)]
    return torch.cat(parts)


def logits_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0, chunk: int = 1024) -> Tensor:
    """The same from logits the model computed itself [T, V] (models whose head cannot be run on its own):
    the fp32 copy and the division by T are made a chunk at a time."""
    step = max(1, int(chunk))
    parts = [_plain_logprobs(logits[s : s + step], targets[s : s + step], temperature)
             for s in range(0, logits.shape[0], step)]
    return torch.cat(parts) if parts else logits.new_zeros(0, dtype=torch.float32)
