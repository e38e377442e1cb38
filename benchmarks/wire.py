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

from swarm_node.protocol import RolloutBatch, decode_batch, encode_batch
from swarm_node.runs.batches import remap_vocab, sample_tiny_batch, zipf_batch

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
