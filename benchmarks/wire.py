"""Every byte a node sends and receives per round, on batches the trained tiny presets publish.

Part 1, the payload. Batches sampled by the trained tiny presets (tiny-s and tiny-m, the demo's round:
16 arithmetic prompts x 8 completions of up to 6 tokens; $SWARM_NODE_PRESETS or built by the factory),
seeds 100.. (the zstd dictionary was trained on seeds 11-13), plus the older stand-ins (a random tiny
Llama, flat or peaked, and a Zipf batch of Qwen-sized completions). Per batch: bytes per completion token
of three layouts, (a) the paper's node, int32 id + fp32 log-prob per token, raw; (b) genrl's decoded text
in msgpack, no log-probs; (c) swarm_node.protocol; beside them the batch's order-0 entropy floor (the
empirical entropy of the completion ids plus that of the quantized log-probs, per token; a coder that
sees each token alone cannot go below it, one that sees repeats can), and encode/decode speed.

Part 2, the round. N SwarmPeers in this process (each with its hivemind DHT child and p2pd) on 127.0.0.1
publish one preset batch per round and take up to K peers' batches, for R rounds after a warm-up. From
each node's own counters, per node and round: payload bytes out (served) and in (downloaded), the blob
transfer's framing (request, status byte, length and digest per download), control bytes out and in
(pushed announcements and DHT records and reads, at application level: libp2p, TLS and TCP/IP headers
are not counted; benchmarks/swarm_scale.py measures those on the loopback), each also per own
completion token.

    python -m benchmarks.wire [--quick] [--seeds N] [--json PATH] [--no-swarm]
    python -m benchmarks.wire --train-dict      # rewrite swarm_node/protocol/zdict.py (a new wire major)
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import json
import platform
import struct
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import numpy as np

from swarm_node.protocol import MAJOR, MINOR, RolloutBatch, decode_batch, encode_batch
from swarm_node.protocol.codec import LOGPROB_SCALE_BITS, batch_to_body, pack_body
from swarm_node.protocol.columns import quantize_logprobs
from swarm_node.runs.stats import mean_std
from tooling.batches import preset_batches, remap_vocab, sample_tiny_batch, zipf_batch
from tooling.benchmark_args import add_run_args, resolve_seeds, write_json

PRESETS = ("tiny-s", "tiny-m")
FIRST_SEED = 100  # away from the dictionary corpus (11-13) and the test fixture (7)
DICT_CORPUS = {"presets": PRESETS, "seeds": (11, 12, 13), "rounds": 5, "size": 1024, "level": 19}

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
    f"swarm_node {MAJOR}.{MINOR}": (encode_batch, decode_batch),
}


def _entropy_bits(values: np.ndarray) -> float:
    if values.size == 0:
        return 0.0
    _, counts = np.unique(values, return_counts=True, axis=0)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def entropy_floor(batch: RolloutBatch) -> dict:
    """Order-0 empirical entropy of the completion ids and of the quantized log-probs, bytes per token."""
    comps = [c for g in batch.groups for c in g.completions]
    if not comps:
        return {"floor_B_per_token": 0.0, "joint_B_per_token": 0.0}
    ids = np.concatenate([np.asarray(c.token_ids, np.int64) for c in comps])
    q = quantize_logprobs(np.concatenate([np.asarray(c.logprobs, np.float64) for c in comps]), LOGPROB_SCALE_BITS)
    return {"floor_B_per_token": (_entropy_bits(ids) + _entropy_bits(q)) / 8,
            "joint_B_per_token": _entropy_bits(np.stack([ids, q], 1)) / 8}


def _best_time(fn: Callable[[], object], min_s: float) -> float:
    best, spent, runs = float("inf"), 0.0, 0
    while spent < min_s or runs < 3:
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        best, spent, runs = min(best, dt), spent + dt, runs + 1
    return best


def measure(name: str, batch: RolloutBatch, min_s: float) -> list[dict]:
    """One row per layout: bytes per completion token, ratio to the paper, encode/decode speed, the floor."""
    n_tok = batch.num_completion_tokens()
    paper_bytes = 8 * n_tok  # the unit "MB/s" is counted in: the paper layout's id+log-prob bytes
    floor = entropy_floor(batch)
    rows, base = [], None
    for layout, (enc, dec) in LAYOUTS.items():
        data = enc(batch)
        base = base or len(data)
        t_enc = _best_time(lambda enc=enc: enc(batch), min_s)
        t_dec = _best_time(lambda dec=dec, data=data: dec(data), min_s)
        rows.append({
            "batch": name, "vocab": batch.vocab_size, "tokens": n_tok, "layout": layout, "bytes": len(data),
            "bytes_per_token": len(data) / n_tok, "vs_paper": len(data) / base, **floor,
            "encode_MBps": paper_bytes / t_enc / 1e6, "decode_MBps": paper_bytes / t_dec / 1e6,
        })
    return rows


# ------------------------------------------------------------------------------------ per-round traffic


def request_framing(round_: int) -> int:
    """Bytes of one blob download besides the payload (swarm/transfer.py): the u16-prefixed JSON request,
    then the status byte, the u64 length and the sha256 digest."""
    return 2 + len(json.dumps({"kind": "batch", "round": round_}).encode()) + 1 + 8 + 32


def swarm_traffic(batches: list[RolloutBatch], n_nodes: int, rounds: int, warmup: int, round_s: float,
                  k: int) -> dict:
    """N real SwarmPeers on 127.0.0.1 exchange the preset batches; per node-round byte counts."""
    from swarm_node.config import SwarmConfig
    from swarm_node.swarm import PeerInfo, SwarmPeer, keep_raw

    first = batches[0]
    info = PeerInfo("grpo", first.model_name, first.tokenizer_fp, first.task_id)

    def cfg(peers: list[str]) -> SwarmConfig:
        return SwarmConfig(enabled=True, swarm_id="wire-bench", initial_peers=peers, max_peers_per_round=k,
                           host_maddrs=["/ip4/127.0.0.1/tcp/0"], bootstrap_retries=5, bootstrap_timeout_s=60)

    nodes = [SwarmPeer(cfg([]), info, validate=keep_raw).start()]  # bytes are measured, not decoded
    try:
        for _ in range(n_nodes - 1):
            nodes.append(SwarmPeer(cfg(nodes[0].visible_maddrs()), info, validate=keep_raw).start())
        rows = []
        for r in range(1, warmup + rounds + 1):
            before = [n.stats() for n in nodes]
            own = []
            for i, n in enumerate(nodes):
                b = dataclasses.replace(batches[(r * n_nodes + i) % len(batches)], round=r)
                n.set_round(r)
                n.publish("batch", r, encode_batch(b))
                own.append(b.num_completion_tokens())
            time.sleep(round_s)
            for i, n in enumerate(nodes):
                got = n.receive(k)
                after = n.stats()
                downloads = after["received"] - before[i]["received"]
                served = after["served"] - before[i]["served"]
                if r > warmup:
                    rows.append({"round": r, "tokens": own[i], "batches_taken": len(got.batches),
                                 "payload_out": got.payload_bytes_out, "payload_in": got.payload_bytes_in,
                                 "framing_out": served * request_framing(r), "framing_in": downloads * request_framing(r),
                                 "control_out": got.control_bytes_out, "control_in": got.control_bytes_in})
    finally:
        for n in reversed(nodes):
            n.close()
    parts = ("payload_out", "payload_in", "framing_out", "framing_in", "control_out", "control_in")
    summary = {p: mean_std([row[p] for row in rows]) for p in parts}
    summary["total"] = mean_std([sum(row[p] for p in parts) for row in rows])
    tokens = float(np.mean([row["tokens"] for row in rows]))
    return {"nodes": n_nodes, "rounds": rounds, "round_s": round_s, "k": k, "tokens_per_round": tokens,
            "batches_taken": float(np.mean([row["batches_taken"] for row in rows])), "per_node_round": summary,
            "rows": rows}


# -------------------------------------------------------------------------------------- dictionary


def train_dictionary(out: Path) -> None:
    """Rebuild protocol/zdict.py from the corpus in DICT_CORPUS (names blanked: layout and statistics only)."""
    import zstandard

    samples = []
    for preset in DICT_CORPUS["presets"]:
        for seed in DICT_CORPUS["seeds"]:
            for b in preset_batches(preset, seed, rounds=DICT_CORPUS["rounds"]):
                blank = dataclasses.replace(b, swarm_id="", task_id="", tokenizer_fp="", model_name="")
                samples.append(pack_body(batch_to_body(blank)))
    raw = zstandard.train_dictionary(DICT_CORPUS["size"], samples, level=DICT_CORPUS["level"]).as_bytes()
    src = out.read_text()
    head, _, rest = src.partition('SHA256 = "')
    tail = rest[rest.index('\n\n\n@functools.cache'):]
    lines = "\n".join(f'    "{line}"' for line in textwrap.wrap(base64.b64encode(raw).decode(), 100))
    out.write_text(f'{head}SHA256 = "{hashlib.sha256(raw).hexdigest()}"\n_B64 = (\n{lines}\n){tail}')
    print(f"{len(samples)} bodies -> {len(raw)}-byte dictionary, sha256 {hashlib.sha256(raw).hexdigest()[:16]}: {out}")


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(ap, seeds=3, quick_seeds=1, first_seed=FIRST_SEED, seeds_help="preset batches per preset",
                 quick="shorter timing loops, no stand-in batches, 4 rounds")
    ap.add_argument("--no-swarm", action="store_true", help="payload only (no DHT, no p2pd)")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10, help="measured rounds, after 3 warm-up rounds")
    ap.add_argument("--round-s", type=float, default=1.0)
    ap.add_argument("--k", type=int, default=2, help="peers' batches taken per round (the demo's K)")
    ap.add_argument("--train-dict", action="store_true", help="rewrite swarm_node/protocol/zdict.py and exit")
    args = ap.parse_args(argv)
    if args.train_dict:
        train_dictionary(Path(__file__).resolve().parents[1] / "swarm_node" / "protocol" / "zdict.py")
        return {}
    seeds = resolve_seeds(args)
    if args.quick:
        args.rounds = 4
    min_s = 0.01 if args.quick else 0.05
    preset = {f"{p} seed {s}": preset_batches(p, s)[0] for p in PRESETS for s in seeds}
    batches = dict(preset)
    if not args.quick:
        flat, peaked = sample_tiny_batch(max_new=64), sample_tiny_batch(max_new=64, logit_scale=8.0)
        batches |= {"random flat": flat, "random peaked -> qwen vocab": remap_vocab(peaked), "zipf qwen-size": zipf_batch()}
    rows = [r for name, b in batches.items() for r in measure(name, b, min_s)]
    print(f"{'batch':28} {'vocab':>6} {'tokens':>6}  {'layout':20} {'B/token':>7} {'floor':>6} {'vs paper':>8} "
          f"{'enc MB/s':>9} {'dec MB/s':>9}")
    for r in rows:
        print(f"{r['batch']:28} {r['vocab']:>6} {r['tokens']:>6}  {r['layout']:20} {r['bytes_per_token']:7.3f} "
              f"{r['floor_B_per_token']:6.3f} {r['vs_paper']:8.3f} {r['encode_MBps']:9.1f} {r['decode_MBps']:9.1f}")
    ours = [r for r in rows if r["layout"].startswith("swarm_node") and r["batch"] in preset]
    bpt, floor = mean_std([r["bytes_per_token"] for r in ours]), mean_std([r["floor_B_per_token"] for r in ours])
    print(f"\ntrained presets, {len(ours)} batches: {bpt[0]:.3f} +- {bpt[1]:.3f} B/token on the payload; "
          f"order-0 floor {floor[0]:.3f} +- {floor[1]:.3f}; joint (id, q) order-0 "
          f"{np.mean([r['joint_B_per_token'] for r in ours]):.3f}")
    print("MB/s = (8 bytes x completion tokens) per second, i.e. in units of the paper layout's payload.")
    out: dict = {"payload": rows, "machine": platform.platform(), "wire": f"{MAJOR}.{MINOR}",
                 "date": time.strftime("%Y-%m-%d", time.gmtime())}
    if not args.no_swarm:
        traffic = swarm_traffic(list(preset.values()), args.nodes, args.rounds, 3, args.round_s, args.k)
        tok = traffic["tokens_per_round"]
        print(f"\nper node and round: {args.nodes} nodes, K = {args.k}, {args.rounds} rounds of {args.round_s} s "
              f"(after 3 warm-up rounds), {tok:.0f} own completion tokens a round, "
              f"{traffic['batches_taken']:.2f} peers' batches taken a round")
        print(f"{'part':14} {'bytes (mean +- std)':>22} {'B/own token':>12} {'share':>7}")
        total = traffic["per_node_round"]["total"][0]
        for part, (m, s) in traffic["per_node_round"].items():
            print(f"{part:14} {m:>13.0f} +- {s:<6.0f} {m / tok:12.3f} {m / total if total else 0:7.1%}")
        out["traffic"] = traffic
    write_json(args.json, out, args)
    return out


if __name__ == "__main__":
    main()
