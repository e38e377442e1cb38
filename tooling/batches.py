"""Rollout batches for measuring and testing the wire codec (test tooling, not installed).

Sampled from a tiny random model, remapped to a Qwen-sized vocabulary, synthetic Zipf batches, or what a
trained tiny preset publishes (preset_batches), and plain-JSON fixtures of them. Used by
benchmarks/wire.py, tests/test_protocol.py and tests/test_wire_size.py.
"""

from __future__ import annotations

import numpy as np

from swarm_node.protocol import Completion, Group, RolloutBatch

QWEN_VOCAB = 151_936


def sample_tiny_batch(
    vocab: int = 100,
    n_prompts: int = 16,
    group_size: int = 8,
    max_new: int = 12,
    logit_scale: float = 1.0,
    prompt_len: int = 8,
    seed: int = 0,
) -> RolloutBatch:
    """Sample a real batch from a tiny random LlamaForCausalLM at temperature 1 (full-vocab log-probs).

    Completion lengths are cut uniformly in [max_new/2, max_new] as if EOS had been sampled; rewards are
    coin flips. `logit_scale` > 1 sharpens the distribution to mimic a trained, confident model.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: threads only add overhead
    try:
        torch.manual_seed(seed)
        cfg = LlamaConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=prompt_len + max_new + 8,
        )
        model = LlamaForCausalLM(cfg).eval()
        gen = torch.Generator().manual_seed(seed)
        prompts = torch.randint(0, vocab, (n_prompts, prompt_len), generator=gen)
        x = prompts.repeat_interleave(group_size, 0)
        toks, lps = [], []
        with torch.no_grad():
            for _ in range(max_new):
                logp = torch.log_softmax(model(x).logits[:, -1, :].float() * logit_scale, -1)
                nxt = torch.multinomial(logp.exp(), 1, generator=gen)
                toks.append(nxt[:, 0])
                lps.append(logp.gather(1, nxt)[:, 0])
                x = torch.cat([x, nxt], 1)
        ids = torch.stack(toks, 1).numpy().astype(np.int64)
        logprobs = torch.stack(lps, 1).numpy().astype(np.float32)
        lens = torch.randint(max(1, max_new // 2), max_new + 1, (len(ids),), generator=gen).numpy()
        rewards = (torch.rand(len(ids), generator=gen) > 0.5).float().numpy()
    finally:
        torch.set_num_threads(threads)
    groups = []
    for p in range(n_prompts):
        rows = range(p * group_size, (p + 1) * group_size)
        comps = [Completion(ids[i, : lens[i]].copy(), logprobs[i, : lens[i]].copy(), float(rewards[i])) for i in rows]
        groups.append(Group(f"prompt-{p}", prompts[p].numpy().astype(np.int64), comps))
    return RolloutBatch("bench-swarm", "tiny-random", "f" * 64, "tiny-llama", 1, vocab, groups)


def remap_vocab(batch: RolloutBatch, vocab: int = QWEN_VOCAB, seed: int = 0) -> RolloutBatch:
    """The same batch with ids sent to distinct random ids of a bigger vocab (18-bit ids at Qwen's size)."""
    table = np.random.default_rng(seed).choice(vocab, batch.vocab_size, replace=False).astype(np.int64)
    groups = [
        Group(g.prompt_id, table[g.prompt_ids], [Completion(table[c.token_ids], c.logprobs, c.reward) for c in g.completions])
        for g in batch.groups
    ]
    return RolloutBatch(batch.swarm_id, batch.task_id, batch.tokenizer_fp, batch.model_name, batch.round, vocab, groups)


def zipf_batch(n_prompts: int = 16, group_size: int = 12, mean_len: int = 250, seed: int = 0) -> RolloutBatch:
    """Synthetic Qwen-sized batch: Zipf(1.1) ids over 151,936, 60% of log-probs ~0, the rest exponential."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(QWEN_VOCAB)

    def ids(n: int) -> np.ndarray:
        return perm[np.minimum(rng.zipf(1.1, n), QWEN_VOCAB - 1)].astype(np.int64)

    groups = []
    for p in range(n_prompts):
        comps = []
        for _ in range(group_size):
            n = int(rng.integers(mean_len // 2, mean_len * 3 // 2))
            lp = -(rng.standard_exponential(n) * 0.8 * (rng.random(n) < 0.4) + rng.random(n) * 1e-3)
            comps.append(Completion(ids(n), lp.astype(np.float32), float(rng.random() < 0.5)))
        groups.append(Group(f"prompt-{p}", ids(80), comps))
    return RolloutBatch("bench-swarm", "zipf", "f" * 64, "synthetic", 1, QWEN_VOCAB, groups)


def preset_batches(preset: str, seed: int, rounds: int = 1, prompts: int = 16, group_size: int = 8,
                   max_new: int = 6, swarm_id: str = "demo") -> list[RolloutBatch]:
    """What a demo node publishes: batches sampled by a trained tiny preset (`swarm-node make-model`, found in
    $SWARM_NODE_PRESETS or built there) through GRPONode.generate, with the node's own rewards and metadata.
    Defaults are peers/tiny-s.yaml's round: 16 arithmetic prompts x 8 completions of up to 6 tokens."""
    import tempfile
    from pathlib import Path

    from swarm_node.config import NodeConfig
    from swarm_node.grpo.round import GRPONode

    cfg = NodeConfig.model_validate({
        "seed": seed, "model": {"path": preset},
        "task": {"name": "arithmetic", "prompts_per_round": prompts},
        "generation": {"num_generations": group_size, "max_new_tokens": max_new},
    })
    with tempfile.TemporaryDirectory() as tmp:
        node = GRPONode(cfg, Path(tmp))
        return [node.generate(r).to_batch(swarm_id=swarm_id, task_id=node.task.task_id,
                                          tokenizer_fp=node.loaded.tokenizer_fp, model_name=node.loaded.name,
                                          round_=r, vocab_size=node.loaded.vocab_size)
                for r in range(1, rounds + 1)]


def batch_to_json(batch: RolloutBatch) -> dict:
    """A batch as plain JSON (test fixtures): ids, float32 log-probs as floats, rewards."""
    return {"swarm_id": batch.swarm_id, "task_id": batch.task_id, "tokenizer_fp": batch.tokenizer_fp,
            "model_name": batch.model_name, "round": batch.round, "vocab_size": batch.vocab_size,
            "groups": [{"prompt_id": g.prompt_id, "prompt_ids": np.asarray(g.prompt_ids).tolist(),
                        "completions": [{"ids": np.asarray(c.token_ids).tolist(),
                                         "logprobs": np.asarray(c.logprobs, np.float32).tolist(), "reward": c.reward}
                                        for c in g.completions]} for g in batch.groups]}


def batch_from_json(obj: dict) -> RolloutBatch:
    groups = [Group(g["prompt_id"], np.array(g["prompt_ids"], dtype=np.int64),
                    [Completion(np.array(c["ids"], dtype=np.int64), np.array(c["logprobs"], dtype=np.float32),
                                float(c["reward"])) for c in g["completions"]]) for g in obj["groups"]]
    return RolloutBatch(obj["swarm_id"], obj["task_id"], obj["tokenizer_fp"], obj["model_name"], obj["round"],
                        obj["vocab_size"], groups)
