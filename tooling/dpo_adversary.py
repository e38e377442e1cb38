"""A hostile DPO neighbour, for tests and benchmarks/dpo_byzantine.py (a test helper, not a product feature).

It looks honest inside (it trains and averages like any node, so it knows where the swarm is) and sends
its neighbours corrupted parameters of the right shapes, finite, through the real payload codec:

    scaled      its parameters times SCALE (1e3)
    sign_flip   its change since the shared initial model, negated: x0 - (x - x0) (with x0 = 0 this is -x)
    noise       its parameters plus Gaussian noise of the same RMS as the parameters
    alie        "a little is enough" (Baruch et al. 2019): the mean of what its neighbours sent, shifted by
                ALIE_Z coordinate-wise standard deviations (in norm) against what the swarm has learned,
                -(mean - x0) / ||mean - x0||: a small shift in (nearly) the same direction every round
    stale       its own parameters of STALE_LAG rounds ago (the initial model before that)
    equivocate  a different point to each neighbour: its parameters shifted by +- EQUIVOCATE_Z coordinate-wise
                standard deviations (in norm) along one fixed random direction, the sign alternating over
                its neighbours, so that they are pulled apart
    huge        +-HUGE (6e4, finite in float16) in every entry, signed like its parameters
    dissensus   the strongest equivocation: to each neighbour, the point that cancels that neighbour's pull
                towards its honest neighbours (the dissensus attack of He, Karimireddy & Jaggi 2022), so
                that none of them moves towards the others; it needs to know every neighbour's neighbours
    paced       dissensus that knows the stall rule (docs/dpo.md, `dpo.stall_ratio`): it cancels the fraction
                c of each neighbour's pull, and steers c (per neighbour, from the pull ratio that neighbour
                had last round) to hold that ratio at PACED_RATIO, just over the default stall_ratio (0.2),
                so that the neighbour moves as little as it can without its neighbourhood widening

In process (the benchmark, tests): `HostileNeighbour(mode).send(view)` gives the tensors for each recipient.
As a process (a multi-process test) it joins a real swarm as a DPO peer through the node's own stack
(DPONode.join_swarm: SwarmPeer, signed records, the blob handler), follows its ring neighbours' rounds by
fetching their parameters, and publishes its corrupted ones for the same round:

    python tooling/dpo_adversary.py --model-dir DIR --maddr MADDR --swarm-id S --mode scaled --rounds N --out F

`equivocate` and `dissensus` need a different payload per reader, which one signed announcement per round cannot carry
(a reader refuses bytes whose sha256 differs from it: `swarm:digest_mismatch`), so the process refuses it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

MODES = ("scaled", "sign_flip", "noise", "alie", "stale", "equivocate", "huge", "dissensus", "paced")
PER_RECIPIENT = ("equivocate", "dissensus", "paced")
OMNISCIENT = ("dissensus", "paced")  # need every recipient's parameters and honest pull (View.recipients)
SCALE = 1e3
ALIE_Z = 1.0
EQUIVOCATE_Z = 3.0
STALE_LAG = 8
HUGE = 6e4
PACED_RATIO = 0.25
PACED_START = 0.5  # the paced attacker's first cancelled fraction of a neighbour's pull
PACED_GAIN = 1.0  # and how fast it steers it (per unit of pull ratio off target)

Params = list[torch.Tensor]


@dataclass
class Recipient:
    """What an omniscient attacker knows of one neighbour: its parameters and its honest pull
    sum_{j honest} W_ij (x_j - x_i); `weight` is the mixing weight the neighbour gives the attacker, and
    `ratio` the neighbour's pull ratio last round (None: none yet; paced only)."""

    params: Params
    pull: Params
    weight: float
    ratio: float | None = None


@dataclass
class View:
    """The attacker's view of one round."""

    round: int
    own: Params  # its honest-looking parameters this round (it trains and averages like a node)
    neighbours: dict[str, Params]  # what its neighbours published this round
    initial: Params  # the shared initial model
    recipients: dict[str, Recipient] = field(default_factory=dict)  # dissensus only


def _norm(ts: Sequence[torch.Tensor]) -> float:
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in ts))


def recipient(xs: Sequence[Params], w: np.ndarray, i: int, honest: set[int], weight: float,
              ratio: float | None = None) -> Recipient:
    """What an omniscient attacker knows of node i, whose mixing weights (its row of its own graph's
    matrix) are w[i]: its honest pull sum_{j honest} W_ij (x_j - x_i); `weight` is the total weight node
    i gives the attackers, `ratio` its pull ratio last round."""
    pull = [torch.zeros_like(t) for t in xs[i]]
    for j in np.flatnonzero(w[i]):
        if j != i and j in honest:
            for o, a, b in zip(pull, xs[j], xs[i], strict=True):
                o.add_(a - b, alpha=float(w[i, j]))
    return Recipient(xs[i], pull, weight, ratio)


class HostileNeighbour:
    """Makes the attack's parameters from the attacker's view of a round, one mode for its whole life."""

    def __init__(self, mode: str, seed: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
        self.mode = mode
        self.gen = torch.Generator().manual_seed(seed)
        self.past: deque[Params] = deque(maxlen=STALE_LAG + 1)
        self.direction: Params | None = None  # equivocate: one random unit direction for its whole life
        self.cancel: dict[str, float] = {}  # paced: the fraction of each recipient's pull it cancels

    @staticmethod
    def _spread(v: View) -> tuple[Params, float]:
        """The coordinate-wise mean of its own and its neighbours' parameters, and the norm of their std."""
        views = [v.own, *v.neighbours.values()]
        mean = [torch.stack([s[k] for s in views]).mean(0) for k in range(len(v.own))]
        std = [torch.stack([s[k] for s in views]).std(0, correction=0) for k in range(len(v.own))]
        return mean, _norm(std)

    def corrupt(self, v: View) -> Params:
        """The one set of parameters this mode sends to every neighbour (all modes but the per-recipient ones)."""
        own = v.own
        self.past.append([t.clone() for t in own])
        if self.mode == "scaled":
            return [t * SCALE for t in own]
        if self.mode == "sign_flip":
            return [2 * x0 - t for t, x0 in zip(own, v.initial, strict=True)]
        if self.mode == "noise":
            rms = _norm(own) / math.sqrt(sum(t.numel() for t in own))
            return [t + rms * torch.randn(t.shape, generator=self.gen) for t in own]
        if self.mode == "alie":
            mean, spread = self._spread(v)
            away = [m - x0 for m, x0 in zip(mean, v.initial, strict=True)]
            size = ALIE_Z * spread / max(_norm(away), 1e-12)
            return [m - size * a for m, a in zip(mean, away, strict=True)]
        if self.mode == "stale":
            return self.past[0] if len(self.past) > STALE_LAG else [t.clone() for t in v.initial]
        if self.mode == "huge":
            return [torch.where(t < 0, -HUGE, HUGE).to(torch.float32) for t in own]
        raise ValueError(f"{self.mode} sends a different point to each neighbour: use send()")

    def _cancel(self, name: str, rec: Recipient) -> Params:
        """The point that cancels the fraction c of the recipient's honest pull: c = 1 (dissensus), or
        (paced) c steered by the recipient's last pull ratio: more when it moved faster than PACED_RATIO,
        less when slower. (A closed form cannot hit the ratio: the node clips its farther neighbour to the
        nearer one's distance or its typical difference, which the attacker does not know.)"""
        c = 1.0
        if self.mode == "paced":
            c = self.cancel.get(name, PACED_START)
            if rec.ratio is not None:
                c = min(1.0, max(0.0, c + PACED_GAIN * (rec.ratio - PACED_RATIO)))
            self.cancel[name] = c
        return [x - c * q / rec.weight for x, q in zip(rec.params, rec.pull, strict=True)]

    def send(self, v: View, recipients: Sequence[str]) -> dict[str, Params]:
        """The parameters each recipient gets this round."""
        if self.mode not in PER_RECIPIENT:
            out = self.corrupt(v)
            return {r: out for r in recipients}
        if self.mode in OMNISCIENT:  # x_i - c pull_i / W_ib: node i's average moves it by (1 - c) pull_i
            return {r: self._cancel(r, v.recipients[r]) for r in recipients}
        if self.direction is None:
            d = [torch.randn(t.shape, generator=self.gen) for t in v.own]
            self.direction = [t / _norm(d) for t in d]
        _mean, spread = self._spread(v)
        return {r: [t + (-1) ** k * EQUIVOCATE_Z * spread * u for t, u in zip(v.own, self.direction, strict=True)]
                for k, r in enumerate(sorted(recipients))}


# ---- as a process on a real swarm ----


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--maddr", required=True)
    ap.add_argument("--swarm-id", required=True)
    ap.add_argument("--mode", required=True, choices=[m for m in MODES if m not in PER_RECIPIENT])
    ap.add_argument("--rounds", type=int, required=True, help="stop after publishing this round - 1")
    ap.add_argument("--out", required=True, help="JSON report: peer id and the rounds it attacked")
    ap.add_argument("--state-dir", default=None)
    ap.add_argument("--seed", type=int, default=99)
    ap.add_argument("--set", action="append", default=[], help="extra config overrides, as for swarm-node run")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Join as a DPO peer, then for each round: fetch the neighbours' parameters, publish the attack's."""
    import tempfile

    from swarm_node.config import load_config
    from swarm_node.dpo.neighbours import plan_round
    from swarm_node.dpo.round import DPONode
    from swarm_node.dpo.vectors import get_params
    from swarm_node.swarm.averaging.payload import PayloadError, decode_params, encode_params

    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s adversary %(levelname)s %(message)s")
    torch.set_num_threads(1)
    sets = ["mode=dpo", f"model.path={args.model_dir}", f"seed={args.seed}", "swarm.enabled=true",
            f"swarm.swarm_id={args.swarm_id}", f"swarm.initial_peers={json.dumps([args.maddr])}",
            'swarm.host_maddrs=["/ip4/127.0.0.1/tcp/0"]', "dpo.pairs_per_user=16", "dpo.heldout_pairs=16", *args.set]
    cfg = load_config(None, sets)
    node = DPONode(cfg, Path(args.state_dir or tempfile.mkdtemp(prefix="dpo-adversary-")))
    node.join_swarm()
    ex, d = node.neighbourhood, cfg.dpo
    hostile = HostileNeighbour(args.mode, args.seed)
    initial = get_params(node.model)
    report: dict = {"peer_id": ex.self_id, "mode": args.mode, "rounds": []}
    r = 0
    try:
        while r < args.rounds:
            plan = plan_round(d, ex.peers(), ex.self_id, r)
            got: dict[str, Params] = {}
            for peer, blob in ex.fetch_all(plan.to_fetch, r).items():
                if blob is not None:
                    try:
                        got[peer] = decode_params(blob, node.shapes, node.arch_fp, d.compression)
                    except PayloadError:
                        pass
            if not got:  # nobody served round r (not started yet, or we fell behind): go to their round
                r = max([r, *ex.peer_rounds().values()])
                time.sleep(0.2)
                continue
            own = [torch.stack([g[k] for g in got.values()]).mean(0) for k in range(len(node.shapes))]
            params = hostile.corrupt(View(r, own, got, initial))
            ex.swarm.set_round(r)
            ex.swarm.publish("params", r, encode_params(params, node.arch_fp, d.compression))
            report["rounds"].append(r)
            tmp = Path(args.out + ".tmp")
            tmp.write_text(json.dumps(report))
            os.replace(tmp, args.out)
            r += 1
        time.sleep(d.gossip_deadline_s)  # the slowest neighbour fetches the last round
    finally:
        node.close()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
