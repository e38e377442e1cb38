"""DPO: sigmoid loss on response-only log-probs against a frozen reference, local steps, held-out accuracy.

Unlike the DDPO reference code (which sums log-probs over prompt + response), only RESPONSE tokens count:
the prompt is identical in both sequences, so its log-prob cancels in the margin anyway, and masking it
keeps the loss exact when prompt truncation differs. Reference log-probs are computed once from the
initial model (the model before any training), so no frozen copy has to be kept in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from swarm_node.tasks.preferences import PreferencePair
from swarm_node.training.params import trainable_parameters


@dataclass
class TokenizedPairs:
    """Right-padded chosen/rejected sequences (prompt + response [+ EOS]) with response masks."""

    chosen_ids: torch.Tensor
    chosen_attn: torch.Tensor
    chosen_resp: torch.Tensor
    rejected_ids: torch.Tensor
    rejected_attn: torch.Tensor
    rejected_resp: torch.Tensor

    def __len__(self) -> int:
        return int(self.chosen_ids.shape[0])

    def select(self, idx: Sequence[int] | np.ndarray) -> TokenizedPairs:
        i = torch.as_tensor(np.asarray(idx), dtype=torch.long)
        return TokenizedPairs(*(getattr(self, f)[i] for f in self.__dataclass_fields__))

    def to(self, device: torch.device | str) -> TokenizedPairs:
        return TokenizedPairs(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def _encode(tokenizer: Any, prompt: str, response: str, max_length: int) -> tuple[list[int], int]:
    """Token ids of prompt + response (+ EOS) and where the response starts; the prompt is cut on the left."""
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    r = tokenizer(response, add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        r = r + [tokenizer.eos_token_id]
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None:
        p = [bos] + p
    r = r[: max_length - 1]
    p = p[max(0, len(p) - (max_length - len(r))) :]
    return p + r, len(p)


def _pad(seqs: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(s) for s, _ in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    resp = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (s, start) in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        attn[i, : len(s)] = 1
        resp[i, start : len(s)] = True
    return ids, attn, resp


def tokenize_pairs(tokenizer: Any, pairs: Sequence[PreferencePair], max_length: int = 128) -> TokenizedPairs:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    c = _pad([_encode(tokenizer, p.prompt, p.chosen, max_length) for p in pairs], pad)
    r = _pad([_encode(tokenizer, p.prompt, p.rejected, max_length) for p in pairs], pad)
    return TokenizedPairs(*c, *r)


def sequence_logps(model: Any, ids: torch.Tensor, attn: torch.Tensor, resp: torch.Tensor) -> torch.Tensor:
    """Sum of log pi(token | prefix) over response tokens only, one value per row."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    targets = ids[:, 1:]
    logp = torch.gather(F.log_softmax(logits, dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)
    return (logp * resp[:, 1:].to(logp.dtype)).sum(dim=-1)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid DPO: -mean log sigmoid(beta * margin); returns (loss, per-pair implicit reward margin)."""
    margin = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    return -F.logsigmoid(margin).mean(), margin.detach()


def pair_logps(model: Any, batch: TokenizedPairs) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) response log-probs, computed in one forward pass over both halves."""
    width = max(batch.chosen_ids.shape[1], batch.rejected_ids.shape[1])

    def widen(t: torch.Tensor, fill: int) -> torch.Tensor:
        return F.pad(t, (0, width - t.shape[1]), value=fill)

    ids = torch.cat([widen(batch.chosen_ids, 0), widen(batch.rejected_ids, 0)])
    attn = torch.cat([widen(batch.chosen_attn, 0), widen(batch.rejected_attn, 0)])
    resp = torch.cat([widen(batch.chosen_resp, 0), widen(batch.rejected_resp, 0)])
    logps = sequence_logps(model, ids, attn, resp)
    n = len(batch)
    return logps[:n], logps[n:]


@torch.no_grad()
def reference_logps(
    model: Any, data: TokenizedPairs, batch_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference log-probs of every pair under `model` as it is now (call before training), on CPU."""
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    out_c, out_r = [], []
    for s in range(0, len(data), batch_size):
        c, r = pair_logps(model, data.select(range(s, min(s + batch_size, len(data)))).to(dev))
        out_c.append(c.cpu())
        out_r.append(r.cpu())
    model.train(was_training)
    return torch.cat(out_c), torch.cat(out_r)


@dataclass
class StepStats:
    loss: float
    accuracy: float  # fraction of the step's pairs with margin > 0
    steps: int


class DPOTrainer:
    """E local DPO steps per round on one node's pairs; the optimizer state never leaves the node."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        train_pairs: Sequence[PreferencePair],
        *,
        beta: float = 0.1,
        lr: float = 1e-3,
        batch_size: int = 8,
        max_length: int = 128,
        grad_clip: float = 1.0,
        weight_decay: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.beta = beta
        self.lr = lr  # the base learning rate the round's schedule scales (node/loop.py)
        self.batch_size = batch_size
        self.max_length = max_length
        self.grad_clip = grad_clip
        self.device = next(model.parameters()).device
        self.rng = np.random.default_rng(seed)
        self.train = tokenize_pairs(tokenizer, train_pairs, max_length)
        self.ref_chosen, self.ref_rejected = reference_logps(model, self.train)
        self.optimizer = torch.optim.AdamW(trainable_parameters(model), lr=lr, weight_decay=weight_decay)

    def step(self) -> tuple[float, float]:
        idx = self.rng.choice(len(self.train), size=min(self.batch_size, len(self.train)), replace=False)
        batch = self.train.select(idx).to(self.device)
        self.model.train()
        pc, pr = pair_logps(self.model, batch)
        i = torch.as_tensor(idx)
        loss, margin = dpo_loss(
            pc, pr, self.ref_chosen[i].to(self.device), self.ref_rejected[i].to(self.device), self.beta
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable_parameters(self.model), self.grad_clip)
        self.optimizer.step()
        return float(loss.item()), float((margin > 0).float().mean().item())

    def local_steps(self, n: int) -> StepStats:
        out = [self.step() for _ in range(n)]
        return StepStats(float(np.mean([o[0] for o in out])), float(np.mean([o[1] for o in out])), n)

    def state_dict(self) -> dict:
        """Optimizer state and the batch sampler's RNG: with both restored, a resumed run is bit-identical."""
        return {"optimizer": self.optimizer.state_dict(), "sampler_rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["sampler_rng"]


class HeldOut:
    """A fixed evaluation set with reference log-probs from the initial model."""

    def __init__(
        self, model: Any, tokenizer: Any, pairs: Sequence[PreferencePair], max_length: int = 128
    ) -> None:
        self.data = tokenize_pairs(tokenizer, pairs, max_length)
        self.ref_chosen, self.ref_rejected = reference_logps(model, self.data)

    @torch.no_grad()
    def scores(self, model: Any, beta: float = 0.1, batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """(DPO loss, per-pair implicit reward margins) of the held-out pairs under `model`."""
        pc, pr = reference_logps(model, self.data, batch_size)
        return dpo_loss(pc, pr, self.ref_chosen, self.ref_rejected, beta)

    def evaluate(self, model: Any, beta: float = 0.1, batch_size: int = 64) -> dict[str, float]:
        """Preference accuracy = fraction of pairs whose implicit reward margin is > 0, and the DPO loss."""
        loss, margin = self.scores(model, beta, batch_size)
        return {"heldout_pref_acc": float((margin > 0).float().mean()), "heldout_dpo_loss": float(loss)}
