"""Network scenarios on a NetLab (tooling/netlab.py): real GRPO nodes behind NATs, bootstraps that die.

Test tooling shared by the slow tests (tests/test_net_scenarios.py) and `benchmarks/network.py`: each
scenario builds its lab, starts real `swarm-node bootstrap` and `swarm-node run` processes inside the
namespaces (swarm_node.runs.local_swarm, the demo's launcher, with an `ip netns exec` prefix), watches
their metrics.jsonl, and returns what it measured; the callers assert on or print it.

Peers are tiny-s GRPO nodes with small rounds (4 prompts x G=8, no evaluation), 1 s heartbeats and an
8 s record TTL, so a scenario takes about a minute of wall time on 2 loaded cores. The thin-uplink
scenario uses network-only peers (synthetic batches, the swarm layer alone) instead: eight GRPO nodes
would not fit the machine, and tiny-s batches (~250 bytes) would not notice a 1 Mbit/s link.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from swarm_node.node.metrics import read_metrics
from swarm_node.runs.local_swarm import (
    Bootstrap,
    Peer,
    child_env,
    start_bootstrap,
    stop_processes,
    write_peer_config,
)
from tooling.netlab import Host, NetLab

ROOT = Path(__file__).resolve().parents[1]
SWARM = "netlab"


def peer_overrides(host: Host, **extra) -> dict:
    """A tiny-s node that does a round in a second or two and listens on its host's address only."""
    return {"rounds": None, "task.prompts_per_round": 4, "task.eval_n": 20, "metrics.eval_every": 1000,
            "checkpoint.every_rounds": 1000, "swarm.swarm_id": SWARM, "swarm.host_maddrs": [host.maddr()],
            "swarm.heartbeat_s": 1.0, "swarm.record_ttl_s": 8.0, "swarm.collect_deadline_s": 8.0,
            "swarm.max_peers_per_round": 4, "swarm.bootstrap_timeout_s": 20.0, **extra}


@dataclass
class Run:
    """The processes of one scenario and when they started (monotonic seconds)."""

    lab: NetLab
    work: Path
    boots: dict[str, Bootstrap] = field(default_factory=dict)
    peers: dict[str, Peer] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    joined: dict[str, float] = field(default_factory=dict)  # seconds from process start to the "peer id" line
    dht_join_s: dict[str, float] = field(default_factory=dict)  # the node's own "joined swarm ... in X s"
    peer_ids: dict[str, str] = field(default_factory=dict)
    seed: int = 1  # every node's sampling seed (the peers' templates use 1)

    def bootstrap(self, host: Host, initial: list[str] | None = None) -> Bootstrap:
        boot = start_bootstrap(self.work / host.name, SWARM, host_maddr=host.maddr(), initial_peers=initial,
                               wrap=self.lab.wrap(host))
        self.boots[host.name] = boot
        return boot

    def peer(self, host: Host, initial: list[str], template: str = "tiny-s", **extra) -> Peer:
        cfg = write_peer_config(ROOT / "peers" / f"{template}.yaml", self.work / "configs" / f"{host.name}.yaml",
                                peer_overrides(host, seed=self.seed, **extra))
        p = Peer(name=host.name, config=cfg, state_dir=self.work / host.name, wrap=self.lab.wrap(host))
        self.started[host.name] = time.monotonic()
        p.start(initial)
        self.peers[host.name] = p
        return p

    def rows(self, name: str) -> list[dict]:
        return read_metrics(self.peers[name].metrics, warn=False)

    def groups_from(self, receiver: str, since_round: int = 0) -> dict[str, int]:
        """Peers' groups `receiver` trained on (by sender name) in rounds after `since_round`."""
        seen: dict[str, int] = {}
        for r in self.rows(receiver):
            if r.get("round", 0) <= since_round:
                continue
            for k, v in (r.get("external_groups_by_peer") or {}).items():
                name = self.name_of(k.split(":", 1)[0])
                seen[name] = seen.get(name, 0) + v
        return seen

    def name_of(self, short_id: str) -> str:
        """The node whose peer id ends in `short_id` (metrics key groups by "<last 8 of peer id>:<model>")."""
        for name, pid in self.peer_ids.items():
            if pid.endswith(short_id):
                return name
        return short_id

    def alive(self, name: str) -> None:
        p = self.peers[name]
        if not p.running():
            raise AssertionError(f"{name} exited with {p.proc.returncode}\n{log_tail(p)}")

    def watch(self, done, timeout_s: float, poll_s: float = 0.5) -> bool:
        """Poll `done()` until true or timeout, recording join times and checking every node is alive."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            self._note_joins()
            for name in self.peers:
                self.alive(name)
            if done():
                return True
            time.sleep(poll_s)
        self._note_joins()
        return False

    def _note_joins(self) -> None:
        for name, p in self.peers.items():
            if name in self.joined or p.log_path is None or not p.log_path.exists():
                continue
            text = p.log_path.read_text(errors="replace")
            m = re.search(r"peer id (\S+);", text)
            if m:
                j = re.search(r"joined swarm '\S+' as \S+ in ([0-9.]+)s", text)
                if j:
                    self.dht_join_s[name] = float(j.group(1))
                self.joined[name] = round(time.monotonic() - self.started[name], 1)
                self.peer_ids[name] = m.group(1)

    def stop(self) -> None:
        stop_processes([p.proc for p in self.peers.values() if p.proc is not None], grace_s=15)
        for b in self.boots.values():
            b.stop()


def log_tail(peer: Peer, n: int = 30) -> str:
    if peer.log_path is None or not peer.log_path.exists():
        return f"[{peer.name}: no log]"
    return f"--- {peer.name} ---\n" + "".join(peer.log_path.read_text().splitlines(keepends=True)[-n:])


def link_total(lab: NetLab, hosts: list[Host]) -> int:
    return sum(sum(lab.host_bytes(h).values()) for h in hosts)


def nat(work: Path, timeout_s: float = 150.0, seed: int = 1, auto_relay: bool = True) -> dict:
    """Two GRPO peers behind two NATs and one public peer, joined through three public bootstraps.

    Three bootstraps because libp2p's autorelay waits for 4 relay candidates (or 3 minutes) before it
    reserves a slot; the public peer is the fourth. The NAT'ed peers set `swarm.use_auto_relay`
    (`auto_relay=False`: the control arm, where the two NAT'ed peers cannot reach each other).
    Measured: each peer's join time, when each (receiver, sender) pair first trained on the other's
    groups, and the bytes through the bootstraps' links (the relays; DHT traffic included) against the
    payload the two NAT'ed peers moved between each other.
    """
    with NetLab() as lab:
        run = Run(lab, work, seed=seed)
        bhosts = [lab.public_host(f"boot{i}") for i in range(3)]
        b0 = run.bootstrap(bhosts[0])
        for h in bhosts[1:]:
            run.bootstrap(h, b0.maddrs)
        initial = [m for b in run.boots.values() for m in b.maddrs]
        pub = lab.public_host("pub")
        ha, hb = lab.home("ha"), lab.home("hb")
        t0 = time.monotonic()
        bytes0 = link_total(lab, bhosts)
        run.peer(pub, initial)
        for h in (ha, hb):
            run.peer(h, initial, **{"swarm.use_auto_relay": auto_relay})
        names = ["pub", "ha", "hb"]
        first: dict[str, float] = {}

        def done() -> bool:
            for r in names:
                got = run.groups_from(r)
                for s in names:
                    if s != r and got.get(s) and f"{r}<-{s}" not in first:
                        first[f"{r}<-{s}"] = round(time.monotonic() - t0, 1)
            if not auto_relay:  # the two NAT'ed peers never meet: done once both traded with pub and said so
                return all(f"{n}<-pub" in first and _lines_with(run.peers[n].log_path, UNREACHABLE_LINE)
                           for n in ("ha", "hb"))
            return len(first) == 6

        try:
            run.watch(done, timeout_s)
            ok = len(first) == 6
            relay_bytes = link_total(lab, bhosts) - bytes0
            nat_payload = _payload_between(run, "ha", "hb")
            out = {"lab": lab.tag, "all_pairs_shared": ok, "first_batch_s": first,
                   "start_to_joined_s": {n: run.joined.get(n) for n in names},
                   "dht_join_s": {n: run.dht_join_s.get(n) for n in names},
                   "groups_from": {n: run.groups_from(n) for n in names},
                   "bootstrap_link_bytes": relay_bytes, "nat_to_nat_payload_bytes": nat_payload,
                   "told_unreachable": {n: _lines_with(run.peers[n].log_path, UNREACHABLE_LINE) for n in names},
                   "wall_s": round(time.monotonic() - t0, 1)}
            if not ok:
                out["logs"] = "\n".join(log_tail(run.peers[n]) for n in names)
            return out
        finally:
            run.stop()


def _lines_with(path: Path, text: str) -> int:
    """How many lines of a peer's log contain `text` (the one-line warnings a user is meant to read)."""
    try:
        return sum(text in line for line in path.read_text(errors="replace").splitlines())
    except OSError:
        return 0


def _payload_between(run: Run, a: str, b: str) -> int:
    """Payload bytes a and b downloaded from each other (bytes_in of the rounds where they trained on each
    other is not split by sender, so this counts the groups' share of each such round's bytes_in)."""
    total = 0
    for r, s in ((a, b), (b, a)):
        for row in run.rows(r):
            by = {run.name_of(k.split(":", 1)[0]): v for k, v in (row.get("external_groups_by_peer") or {}).items()}
            ext = sum(by.values())
            if by.get(s) and ext:
                total += int(row.get("bytes_in", 0) * by[s] / ext)
    return total


def bootstrap_dies(work: Path, timeout_s: float = 120.0, seed: int = 1) -> dict:
    """Two bootstraps; two peers exchange; one bootstrap is SIGKILLed; a new peer joins through the other.

    Every peer lists both bootstraps, the dead one first. Measured: whether the running peers trained on
    each other's groups after the kill, the newcomer's join time, and when everyone had its groups.
    """
    with NetLab() as lab:
        run = Run(lab, work, seed=seed)
        h0, h1 = lab.public_host("boot0"), lab.public_host("boot1")
        b0 = run.bootstrap(h0)
        b1 = run.bootstrap(h1, b0.maddrs)
        initial = [*b0.maddrs, *b1.maddrs]
        p1, p2 = lab.public_host("p1"), lab.public_host("p2")
        run.peer(p1, initial)
        run.peer(p2, initial)
        try:
            before = run.watch(lambda: run.groups_from("p1").get("p2") and run.groups_from("p2").get("p1"), timeout_s)
            last = {n: (run.rows(n) or [{"round": 0}])[-1]["round"] for n in ("p1", "p2")}
            os.killpg(b0.proc.pid, signal.SIGKILL)
            b0.proc.wait(10)
            t_kill = time.monotonic()
            p3 = lab.public_host("p3")
            run.peer(p3, initial)

            def after() -> bool:
                return all(run.groups_from(r, last.get(r, 0)).get(s)
                           for r, s in (("p1", "p2"), ("p2", "p1"), ("p3", "p1"), ("p3", "p2"), ("p1", "p3"), ("p2", "p3")))

            ok = run.watch(after, timeout_s)
            out = {"lab": lab.tag, "exchanging_before_kill": bool(before), "all_exchange_after_kill": ok,
                   "newcomer_start_to_joined_s": run.joined.get("p3"),
                   "dht_join_s": dict(run.dht_join_s), "after_kill_s": round(time.monotonic() - t_kill, 1),
                   "groups_after_kill": {n: run.groups_from(n, last.get(n, 0)) for n in ("p1", "p2", "p3")}}
            if not ok:
                out["logs"] = "\n".join(log_tail(run.peers[n]) for n in ("p1", "p2", "p3"))
            return out
        finally:
            run.stop()


def link_cut(work: Path, down_s: float = 60.0, timeout_s: float = 120.0, seed: int = 1) -> dict:
    """Three public peers exchange; one's link goes down for `down_s` and comes back.

    Measured: the cut peer's rounds during the cut (it keeps training on its own samples: an async round
    never waits), its longest round gap from the cut on (a stuck round would show here), its swarm errors, and the
    seconds from the link's return until it and the others trained on each other's groups again.
    """
    with NetLab() as lab:
        run = Run(lab, work, seed=seed)
        boot = run.bootstrap(lab.public_host("boot"))
        hosts = [lab.public_host(n) for n in ("p1", "p2", "cut")]
        for h in hosts:
            run.peer(h, boot.maddrs)
        pairs = [(r, s) for r in ("p1", "p2", "cut") for s in ("p1", "p2", "cut") if r != s]
        try:
            before = run.watch(lambda: all(run.groups_from(r).get(s) for r, s in pairs), timeout_s)
            cut_at = (run.rows("cut") or [{"round": 0}])[-1]["round"]
            lab.link("cut", up=False)
            t_cut = time.time()
            run.watch(lambda: False, down_s)  # every node must stay alive through the cut
            lab.link("cut", up=True)
            t_up = time.time()
            # each node's own round at the link's return (their round counters differ: the cut node ran
            # hundreds of rounds alone, faster without peers' groups to train on)
            back_at = {n: (run.rows(n) or [{"round": 0}])[-1]["round"] for n in ("p1", "p2", "cut")}
            after = run.watch(lambda: all(run.groups_from(r, back_at[r]).get(s) for r, s in pairs
                                          if "cut" in (r, s)), timeout_s)
            rows = run.rows("cut")
            # from the last round before the cut on: the join (a first round waits up to the collect deadline
            # for the peers' first batches) is not what a stuck round during the cut would look like
            times = [r["time"] for r in rows if "time" in r and r["round"] >= cut_at]
            gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
            during = [r for r in rows if cut_at < r["round"] <= back_at["cut"]]
            out = {"lab": lab.tag, "exchanging_before_cut": bool(before), "dht_join_s": dict(run.dht_join_s), "exchange_after_restore": after,
                   "down_s": round(t_up - t_cut, 1),
                   "rejoin_s": round(time.time() - t_up, 1) if after else None,
                   "rounds_during_cut": back_at["cut"] - cut_at,
                   "external_groups_during_cut": sum(r.get("external_groups", 0) for r in during),
                   "longest_round_gap_s": round(max(gaps), 1) if gaps else None,
                   "rejected_during_cut": _sum_dicts(r.get("rejected") or {} for r in during),
                   "groups_after_restore": {n: run.groups_from(n, back_at[n]) for n in ("p1", "p2", "cut")},
                   # the cut node's own account: alone in its member reads, it pinged the peers it knew
                   "rejoined_by_ping": REJOIN_LINE in run.peers["cut"].log_path.read_text(errors="replace")}
            if not after:
                out["logs"] = "\n".join(log_tail(run.peers[n]) for n in ("p1", "p2", "cut"))
            return out
        finally:
            run.stop()


REJOIN_LINE = "known peer(s) answered a ping; rejoining"  # swarm/peer.py, SwarmPeer._rejoin_if_alone
UNREACHABLE_LINE = "unreachable from here"  # swarm/addresses.py, unreachable_warning


def _sum_dicts(dicts) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            if isinstance(v, (int, float)):
                total[k] = total.get(k, 0) + v
    return total


SYNTHETIC = r"""
import json, os, sys, time
from swarm_node.config import SwarmConfig
from swarm_node.swarm import PeerInfo, SwarmPeer, keep_raw
boot, host, out, stop, round_s, nbytes, k, deadline = sys.argv[1:9]
round_s, nbytes, k, deadline = float(round_s), int(nbytes), int(k), float(deadline)
cfg = SwarmConfig(enabled=True, swarm_id="netlab-thin", initial_peers=boot.split(","), host_maddrs=[f"/ip4/{host}/tcp/0"],
                  max_peers_per_round=k, heartbeat_s=1.0, record_ttl_s=8.0, collect_deadline_s=deadline,
                  bootstrap_retries=5, bootstrap_timeout_s=30)
node = SwarmPeer(cfg, PeerInfo("grpo", "synthetic", "tok", "synthetic"), validate=keep_raw).start()
rows, r = [], 0
with open(out + ".id", "w") as f:
    f.write(node.peer_id)
while not os.path.exists(stop):
    r += 1
    t0 = time.time()
    node.publish("batch", r, os.urandom(nbytes))
    got = node.receive(k)
    rows.append({"t": t0, "from": [b.peer_id for b in got.batches], "rejected": got.rejected})
    time.sleep(max(0.0, t0 + round_s - time.time()))
json.dump({"peer_id": node.peer_id, "rows": rows, "stats": node.stats()}, open(out, "w"))
node.close()
"""


def thin_uplink(work: Path, peers: int = 8, thin_mbit: float = 1.0, fast_mbit: float = 50.0,
                batch_bytes: int = 64_000, round_s: float = 1.0, k: int = 4, deadline_s: float = 8.0,
                warmup_s: float = 20.0, measure_s: float = 40.0, start_timeout_s: float = 120.0) -> dict:
    """`peers` network-only peers (synthetic batches of `batch_bytes`, one round per `round_s`, no model:
    the swarm layer alone), one on a `thin_mbit` uplink and the others on `fast_mbit`.

    The warm-up counts from the moment every peer has started its node (8 processes importing torch and
    starting p2pd on 2 cores took 23 s idle, which a fixed warm-up from launch ate into). Reported over the
    window after warm-up: each peer's rounds (its pace), batches it took per round and
    from the thin peer, and refusals by reason (a download that missed its deadline is `timeout`).
    `thin_mbit=fast_mbit` is the control arm.
    """
    with NetLab() as lab:
        run = Run(lab, work)
        boot = run.bootstrap(lab.public_host("boot"))
        hosts = [lab.public_host("thin", rate_mbit=thin_mbit)]
        hosts += [lab.public_host(f"p{i}", rate_mbit=fast_mbit) for i in range(1, peers)]
        stop = work / "stop"
        procs = []
        for h in hosts:
            with open(work / f"{h.name}.err", "w") as err:  # the child keeps its own copy of the descriptor
                procs.append(lab.popen(h, [sys.executable, "-c", SYNTHETIC, ",".join(boot.maddrs), h.ip,
                                           str(work / f"{h.name}.json"), str(stop), str(round_s),
                                           str(batch_bytes), str(k), str(deadline_s)],
                                       env=child_env(), stdout=subprocess.DEVNULL, stderr=err))
        try:
            t_start = time.monotonic()  # every peer has written its id (its node is up), or exited
            run.watch(lambda: all((work / f"{h.name}.json.id").exists() or p.poll() is not None
                                  for h, p in zip(hosts, procs, strict=True)), start_timeout_s, poll_s=0.2)
            started_s = round(time.monotonic() - t_start, 1)
            time.sleep(warmup_s + measure_s)
            t_window = time.time() - measure_s
            stop.write_text("")
            for p in procs:
                p.wait(60)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            boot.stop()
        ids = {h.name: (work / f"{h.name}.json.id").read_text() for h in hosts if (work / f"{h.name}.json.id").exists()}
        by_id = {v: k_ for k_, v in ids.items()}
        out: dict = {"lab": lab.tag, "thin_mbit": thin_mbit, "fast_mbit": fast_mbit, "batch_bytes": batch_bytes,
                     "measure_s": measure_s, "started_s": started_s, "peers": {}}
        for h in hosts:
            path = work / f"{h.name}.json"
            if not path.exists():
                out["peers"][h.name] = {"finished": False}
                continue
            doc = json.loads(path.read_text())
            rows = [r for r in doc["rows"] if r["t"] >= t_window]
            senders = [by_id.get(pid, "?") for r in rows for pid in r["from"]]
            out["peers"][h.name] = {
                "rounds": len(rows),
                "round_s": round(measure_s / len(rows), 2) if rows else None,
                "batches_per_round": round(len(senders) / len(rows), 2) if rows else 0.0,
                "from_thin_per_round": round(senders.count("thin") / len(rows), 2) if rows else 0.0,
                "rejected": _sum_dicts(r["rejected"] for r in rows),
            }
        return out
