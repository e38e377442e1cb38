"""Bytes per completion token and encode/decode speed of three wire layouts for rollout batches.

(a) the paper's node: int32 id + fp32 log-prob per token, raw; (b) genrl: decoded text in msgpack, no
log-probs; (c) swarm_node.protocol. Batches are sampled from a tiny random Llama (flat: untrained
logits; peaked: logits x8, like a trained model) at its native vocab and with ids remapped into a
151,936-entry vocab (Qwen2.5's), plus a Zipf-distributed synthetic batch of Qwen-sized completions.

    python benchmarks/wire.py [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import struct
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import numpy as np

from swarm_node.protocol import Completion, Group, RolloutBatch, decode_batch, encode_batch

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


# ------------------------------------------------------------------------------------ baseline layouts


def paper_encode(batch: RolloutBatch) -> bytes:
    """Raw int32 ids + fp32 log-probs (and an int32 length / fp32 reward per sequence), no compression."""
    parts = [struct.pack("<i", len(batch.groups))]
    for g in batch.groups:
        parts += [struct.pack("<ii", len(g.prompt_ids), len(g.completions)), g.prompt_ids.astype("<i4").tobytes()]
        for c in g.completions:
            parts += [struct.pack("<if", len(c.token_ids), c.reward), c.token_ids.astype("<i4").tobytes()]
            parts.append(np.asarray(c.logprobs, dtype="<f4").tobytes())
    return b"".join(parts)


def paper_decode(data: bytes) -> list:
    """Inverse of paper_encode (no validation: the baseline trusts its peers)."""
    (n_groups,), pos, out = struct.unpack_from("<i", data), 4, []
    for _ in range(n_groups):
        plen, n_comp = struct.unpack_from("<ii", data, pos)
        pos += 8
        prompt = np.frombuffer(data, "<i4", plen, pos)
        pos += 4 * plen
        comps = []
        for _ in range(n_comp):
            n, reward = struct.unpack_from("<if", data, pos)
            pos += 8
            comps.append((np.frombuffer(data, "<i4", n, pos), np.frombuffer(data, "<f4", n, pos + 4 * n), reward))
            pos += 8 * n
        out.append((prompt, comps))
    return out


def _text(ids: np.ndarray) -> str:
    return "".join(chr(32 + i % 95) for i in ids.tolist())


def text_encode(batch: RolloutBatch) -> bytes:
    """genrl's way: decoded text + rewards in msgpack, no log-probs (one printable char per token here;
    real tokens average 3-4 characters, so real text is larger)."""
    rows = [
        {"id": g.prompt_id, "prompt": _text(g.prompt_ids), "completions": [_text(c.token_ids) for c in g.completions],
         "rewards": [c.reward for c in g.completions]}
        for g in batch.groups
    ]
    return msgpack.packb({"task": batch.task_id, "round": batch.round, "groups": rows}, use_bin_type=True)


def text_decode(data: bytes) -> dict:
    return msgpack.unpackb(data, raw=False)


LAYOUTS: dict[str, tuple[Callable[[RolloutBatch], bytes], Callable[[bytes], object]]] = {
    "paper int32+fp32": (paper_encode, paper_decode),
    "genrl text msgpack": (text_encode, text_decode),
    "swarm_node v1": (encode_batch, decode_batch),
}


def _best_time(fn: Callable[[], object], min_s: float) -> float:
    best, spent, runs = float("inf"), 0.0, 0
    while spent < min_s or runs < 3:
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        best, spent, runs = min(best, dt), spent + dt, runs + 1
    return best


def measure(name: str, batch: RolloutBatch, min_s: float) -> list[dict]:
    """One row per layout: bytes per completion token, ratio to the paper, encode/decode speed."""
    n_tok = batch.num_completion_tokens()
    paper_bytes = 8 * n_tok  # the figure "MB/s" is measured in: the paper layout's id+log-prob bytes
    rows, base = [], None
    for layout, (enc, dec) in LAYOUTS.items():
        data = enc(batch)
        base = base or len(data)
        t_enc = _best_time(lambda enc=enc: enc(batch), min_s)
        t_dec = _best_time(lambda dec=dec, data=data: dec(data), min_s)
        rows.append({
            "batch": name, "vocab": batch.vocab_size, "tokens": n_tok, "layout": layout, "bytes": len(data),
            "bytes_per_token": len(data) / n_tok, "vs_paper": len(data) / base,
            "encode_MBps": paper_bytes / t_enc / 1e6, "decode_MBps": paper_bytes / t_dec / 1e6,
        })
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    ap.add_argument("--quick", action="store_true", help="shorter timing loops")
    args = ap.parse_args(argv)
    min_s = 0.01 if args.quick else 0.05
    flat = sample_tiny_batch(max_new=64)
    peaked = sample_tiny_batch(max_new=64, logit_scale=8.0)
    batches = {
        "tiny flat": flat, "tiny flat -> qwen vocab": remap_vocab(flat),
        "tiny peaked": peaked, "tiny peaked -> qwen vocab": remap_vocab(peaked),
        "zipf qwen-size": zipf_batch(),
    }
    rows = [r for name, b in batches.items() for r in measure(name, b, min_s)]
    print(f"{'batch':26} {'vocab':>7} {'tokens':>6}  {'layout':20} {'B/token':>7} {'vs paper':>8} {'enc MB/s':>9} {'dec MB/s':>9}")
    for r in rows:
        print(f"{r['batch']:26} {r['vocab']:>7} {r['tokens']:>6}  {r['layout']:20} {r['bytes_per_token']:7.3f} "
              f"{r['vs_paper']:8.3f} {r['encode_MBps']:9.1f} {r['decode_MBps']:9.1f}")
    print("MB/s = (8 bytes x completion tokens) per second, i.e. in units of the paper layout's payload.")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
