"""One simulated swarm: SimPy processes for every node's round loop and heartbeat, a churn process, and the
DHT's member keys as plain dictionaries. Costs come from costs.py, lookup lengths from kad.py, the sampled
arm's policy from policy.py, and each node's round choice from the real swarm_node.grpo.defences.NewcomerGate.

Two arms:
- `full` (today): one members key; a store or merged read is a beam-4 lookup whose holders each answer with
  the whole dictionary, every P(N) = max(20 s, 5 s x view/8); records live 3P; the view is every listed peer;
  push targets are random; the key takes at most 1,024 subkeys.
- `sampled`: records sharded over 2^level keys, written at 3 levels every 20 s by quiet store (lookup of
  key ^ 1, then 3 call_store); a quiet read of one random shard every 10 s; a bounded view with expiry;
  ranked, sticky push targets.

Bytes are charged once per exchange, at whoever starts it, as the loopback counter of benchmarks/swarm_scale.py
counts them; per node and round = bytes in the measured window / node-rounds in it.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

import simpy

from swarm_node.grpo.defences import NewcomerGate
from tooling.swarm_sim import kad
from tooling.swarm_sim import policy as pol
from tooling.swarm_sim.costs import Costs

SWARM = "sim"
FULL_SUBKEY_CAP = 1024  # swarm/dht_bounds.py: subkeys per key
CIRCUITS_PER_PEER = 16  # p2pd relayMaxCircuits: relayed connections into one NAT'd peer
RESERVATIONS_PER_RELAY = 128  # p2pd relayMaxReservations
CONN_GRACE_S = 120.0  # p2pd connection grace: an idle connection may be trimmed after this
SAMPLED_STORE_S = 20.0
SAMPLED_READ_S = 10.0
JOIN_READS = 3  # a sampled joiner's quiet reads at most before its first publish


@dataclass
class SimConfig:
    """One run. `calibration` reproduces benchmarks/swarm_scale.py: a bootstrap plus peers joining 1 s apart,
    localhost links, measured from `warmup_s` after the last join."""

    nodes: int
    arm: str = "sampled"  # full | sampled
    churn_per_min: float = 0.0  # share of peers leaving (and as many joining) per minute
    relayed: float = 0.0  # share of peers behind NAT, reached through relays
    k: int = 4
    fanout: int = 4
    round_s: float = 1.0
    heartbeat_s: float = 5.0
    ttl_s: float = 60.0
    warmup_s: float = 30.0
    measure_s: float = 30.0
    batch_bytes: int = 3700
    max_batch_age_s: float = 10.0
    conn_hi: int = 512
    profile: str = "wan"  # localhost | wan
    calibration: bool = False
    seed: int = 0


class _Offer:
    """An announced batch as the receiver holds it (`peer_id` is what NewcomerGate.choose reads)."""

    __slots__ = ("peer_id", "round", "generated", "arrival", "receipt")

    def __init__(self, peer_id: int, round_: int, generated: float, arrival: float, receipt: float) -> None:
        self.peer_id, self.round, self.generated, self.arrival, self.receipt = peer_id, round_, generated, arrival, receipt


class _Node:
    __slots__ = ("pid", "alive", "nat", "relay", "uplink", "busy_until", "gate", "offers", "conns", "circuits",
                 "view", "level", "last_targets", "latest", "joiner", "joined_at", "first_admit", "heard",
                 "next_store", "next_read", "rounds", "unreachable", "lp", "viewset", "greeted")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.alive = True
        self.offers: dict[int, _Offer] = {}
        self.conns: OrderedDict[int, float] = OrderedDict()
        self.circuits: OrderedDict[int, float] = OrderedDict()
        self.last_targets: list[int] = []
        self.latest: tuple[int, float] | None = None  # (round, generated) of our newest batch
        self.heard: dict[int, int] = {}  # pusher -> our round when it last pushed to us
        self.first_admit = None
        self.rounds = 0
        self.unreachable: set[int] = set()
        self.greeted: set[int] = set()


@dataclass
class SimResult:
    config: dict
    policy: str
    control_bytes_per_node_round: float
    components: dict = field(default_factory=dict)  # bytes per node-round by mechanism
    batches_per_round: float = 0.0
    batches_share_of_k: float = 0.0
    rounds_with_k: float = 0.0
    latency_median_s: float | None = None
    latency_p90_s: float | None = None
    joiners: int = 0
    joiner_first_batch_median_rounds: float | None = None
    joiner_first_batch_p90_rounds: float | None = None
    joiners_without_batch: int = 0
    failed_pushes_per_node_round: float = 0.0
    refused_stores: int = 0
    largest_reply_bytes: float = 0.0
    relay_bytes_per_relay_s: float = 0.0
    relays: int = 0
    node_rounds: int = 0
    final_levels: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


class World:
    """Builds the nodes and processes of one run; `run()` returns its SimResult."""

    def __init__(self, cfg: SimConfig, costs: Costs | None = None) -> None:
        if cfg.arm not in ("full", "sampled"):
            raise ValueError(f"arm must be full or sampled, got {cfg.arm!r}")
        self.cfg, self.c = cfg, costs or Costs()
        self.env = simpy.Environment()
        self.rng = random.Random(cfg.seed)
        self.nodes: list[_Node] = []
        self.alive: list[int] = []
        self.public_alive = 0  # alive peers that serve the DHT
        self._alive_at: dict[int, int] = {}
        self.dht: dict[str, dict[int, tuple[float, int]]] = {}  # key -> pid -> (expires, writer level)
        self.bytes: dict[str, float] = {}
        self.node_rounds = 0
        self.taken: list[int] = []
        self.latencies: list[float] = []
        self.joiner_rounds: list[int] = []
        self.joiners: list[_Node] = []
        self.failed_pushes = 0
        self.refused_stores = 0
        self.largest_reply = 0.0
        self.relay_bytes = 0.0  # control bytes through relays
        self.relay_payload = 0.0  # batch payload bytes through relays
        expected_nat = cfg.relayed * cfg.nodes * 1.2
        self.relays = max(1, math.ceil(expected_nat / RESERVATIONS_PER_RELAY)) if cfg.relayed > 0 else 0
        self.t0 = (cfg.nodes + cfg.warmup_s) if cfg.calibration else cfg.warmup_s
        self.t1 = self.t0 + cfg.measure_s

    # ---- bookkeeping -------------------------------------------------------------------------------------

    def _in_window(self) -> bool:
        return self.t0 <= self.env.now < self.t1

    def charge(self, what: str, nbytes: float, relayed: bool = False) -> None:
        if self._in_window():
            self.bytes[what] = self.bytes.get(what, 0.0) + nbytes * (2 if relayed else 1)
            if relayed:
                self.relay_bytes += nbytes

    def dht_nodes(self) -> int:
        """Nodes that serve the DHT: public peers (NAT'd ones run as clients), plus the bootstrap."""
        return max(2, self.public_alive + 1)

    def latency(self, relayed: bool) -> float:
        if self.cfg.profile == "localhost":
            base = 0.0001
        else:
            base = 0.03 * math.exp(self.rng.gauss(0.0, 0.94))  # one way: RTT median 60 ms, p90 ~200 ms
        return base * (2 if relayed else 1)

    # ---- nodes -------------------------------------------------------------------------------------------

    def add_node(self, joiner: bool) -> _Node:
        n = _Node(len(self.nodes))
        n.nat = self.rng.random() < self.cfg.relayed
        n.relay = self.rng.randrange(self.relays) if n.nat else -1
        n.uplink = (math.inf if self.cfg.profile == "localhost"
                    else 1e6 / 8 * math.exp(self.rng.uniform(math.log(2), math.log(100))))  # bytes/s
        n.busy_until = 0.0
        n.gate = NewcomerGate(max_new=max(1, self.cfg.k // 4), rng=random.Random(self.rng.getrandbits(32)))
        n.view = pol.ViewBook(pol.VIEW_SIZE, self.cfg.ttl_s) if self.cfg.arm == "sampled" else []
        n.viewset = set()
        n.level = 0
        n.lp = pol.LevelPolicy(0)
        n.joiner, n.joined_at = joiner, self.env.now
        n.next_store = n.next_read = 0.0
        self.nodes.append(n)
        self._alive_at[n.pid] = len(self.alive)
        self.alive.append(n.pid)
        self.public_alive += not n.nat
        if joiner:
            self.joiners.append(n)
        return n

    def remove_node(self, pid: int) -> None:
        self.nodes[pid].alive = False
        self.public_alive -= not self.nodes[pid].nat
        i = self._alive_at.pop(pid)
        last = self.alive.pop()
        if last != pid:
            self.alive[i] = last
            self._alive_at[last] = i

    @staticmethod
    def set_full_view(n: _Node, members: list[int]) -> None:
        n.view, n.viewset = members, set(members)

    def full_period(self, n: _Node) -> float:
        """membership.refresh_period: max(TTL/3, heartbeat x view/8)."""
        return max(self.cfg.ttl_s / 3, self.cfg.heartbeat_s * max(1.0, len(n.view) / 8))

    # ---- DHT ---------------------------------------------------------------------------------------------

    def lookup(self, what: str, holders_entries: float = 0.0, entry: float = 0.0) -> None:
        """One beam-4 lookup: its find RPCs, the holders' dictionaries (full mode), and new connections to
        DHT nodes outside our open ones (about all of them beyond the first two hops at N >> conn_hi)."""
        d = self.dht_nodes()
        rpcs = kad.lookup_rpcs(d)
        self.charge(what, rpcs * self.c.find_rpc(d))
        if holders_entries:
            holders = min(self.c.full_holders, d - 1)
            self.charge(what, holders * holders_entries * entry)
            self.largest_reply = max(self.largest_reply, holders_entries * entry)
        unconnected = max(0.0, rpcs - 2) * max(0.0, 1 - self.cfg.conn_hi / d)
        self.charge("dht_connections", unconnected * self.c.new_connection)

    def live_entries(self, key: str) -> dict[int, tuple[float, int]]:
        d = self.dht.setdefault(key, {})
        now = self.env.now
        for pid in [p for p, (exp, _lv) in d.items() if exp <= now]:
            del d[pid]
        return d

    def put(self, key: str, pid: int, expires: float, level: int, cap: int) -> None:
        d = self.live_entries(key)
        if pid not in d and len(d) >= cap:
            self.refused_stores += 1
            return
        d[pid] = (expires, level)

    def full_store(self, n: _Node) -> None:
        period = self.full_period(n)
        ttl = max(self.cfg.ttl_s, 3 * period)
        for key, entry, what in ((f"{SWARM}_members", self.c.entry, "dht_member_store"),
                                 (f"{SWARM}_batch", self.c.batch_entry, "dht_batch_store")):
            self.lookup(what, len(self.live_entries(key)), entry)
            self.charge(what, self.c.full_holders * self.c.store_rpc)
            self.put(key, n.pid, self.env.now + ttl, 0, FULL_SUBKEY_CAP)
        n.next_store = self.env.now + period - 0.5

    def full_read(self, n: _Node) -> None:
        members = self.live_entries(f"{SWARM}_members")
        self.lookup("dht_member_read", len(members), self.c.entry)
        self.set_full_view(n, [p for p in members if p != n.pid])
        n.next_read = self.env.now + self.full_period(n)
        fresh = [p for p in n.view if p not in n.greeted]  # view.greet: every listed peer not greeted yet
        n.greeted.update(fresh)
        for tid in fresh:
            self.push(n, tid, "greets")

    def sampled_store(self, n: _Node) -> None:
        for key in pol.write_keys(SWARM, str(n.pid), n.level):
            self.lookup("dht_quiet_store")
            self.charge("dht_quiet_store", 3 * self.c.store_rpc)
            self.put(key, n.pid, self.env.now + self.cfg.ttl_s, n.level, pol.SHARD_SUBKEYS)
        n.next_store = self.env.now + SAMPLED_STORE_S

    def sampled_read(self, n: _Node) -> int:
        read_level = n.lp.read_level(self.rng)  # our level, or now and then a deeper probe (as shards.py reads)
        key = pol.random_read_key(SWARM, read_level, self.rng)
        entries = self.live_entries(key)
        self.lookup("dht_quiet_read")
        self.charge("dht_quiet_read", self.c.find_base + len(entries) * self.c.entry)
        self.largest_reply = max(self.largest_reply, len(entries) * self.c.entry)
        now = self.env.now
        for pid, (exp, _lv) in entries.items():
            if pid != n.pid:
                n.view.add(pid, None, exp - self.cfg.ttl_s, now, self.rank(n, pid))
        writers = [lv for pid, (_e, lv) in entries.items() if pid != n.pid]
        n.level = n.lp.observe(len(entries), writers, read_level=read_level)
        n.next_read = now + SAMPLED_READ_S
        return len(entries)

    # ---- pushes, targets, rounds -------------------------------------------------------------------------

    def rank(self, n: _Node, pid: int) -> int:
        if n.gate.established(pid):
            return 0
        if n.gate.rounds_passed(pid) or n.rounds - n.heard.get(pid, -99) <= 3:
            return 1
        return 2

    def targets(self, n: _Node) -> list[int]:
        f = self.cfg.fanout
        if self.cfg.arm == "full":  # view.targets: trusted (established) fill F-1, strangers the rest
            trusted = [p for p in n.gate._passed if n.gate.established(p) and p in n.viewset
                       and p not in n.unreachable]
            pool = self.rng.sample(n.view, min(f + len(n.unreachable) + len(trusted), len(n.view)))
            strangers = [p for p in pool if p not in n.unreachable and not n.gate.established(p)]
            take = min(len(trusted), f - 1 if strangers and f > 1 else f)
            return self.rng.sample(trusted, take) + strangers[:f - take]
        n.view.expire(self.env.now)
        return pol.pick_targets(n.view.peers(), lambda p: self.rank(n, p), f, self.rng)

    def _connect(self, n: _Node, t: _Node) -> bool:
        """Open (or reuse) a connection n -> t: a new one costs a handshake, plus a FindPeer in full mode
        (its records carry no addresses); into a NAT'd peer it takes one of its relay circuits."""
        now = self.env.now
        if t.pid in n.conns:
            n.conns.move_to_end(t.pid)
            n.conns[t.pid] = now
            if t.nat and n.pid in t.circuits:
                t.circuits[n.pid] = now
            return True
        if t.nat:
            if len(t.circuits) >= CIRCUITS_PER_PEER:
                oldest, used = next(iter(t.circuits.items()))
                if now - used < CONN_GRACE_S and self.nodes[oldest].alive:
                    return False
                t.circuits.popitem(last=False)
            t.circuits[n.pid] = now
        self.charge("connections", self.c.new_connection + (self.c.find_peer if self.cfg.arm == "full" else 0),
                    relayed=t.nat)
        for a, b in ((n, t), (t, n)):
            a.conns[b.pid] = now
            if len(a.conns) > self.cfg.conn_hi:
                a.conns.popitem(last=False)
        return True

    def push(self, n: _Node, tid: int, what: str = "pushes") -> bool:
        """Announce our latest batch to `tid`; it buffers the offer (one per peer) and greets a pusher new to it."""
        t = self.nodes[tid]
        if n.latest is None:
            return False
        if not t.alive or not self._connect(n, t):
            self.failed_pushes += self._in_window()
            self.charge("failed_pushes", self.c.push / 2)
            if self.cfg.arm == "full":
                n.unreachable.add(tid)
            return False
        self.charge(what, self.c.push, relayed=t.nat)
        rnd, gen = n.latest
        now = self.env.now
        arrival = now + self.latency(t.nat)
        start = max(arrival, n.busy_until)  # t downloads from n's capped uplink, FIFO
        n.busy_until = start + self.cfg.batch_bytes / n.uplink
        receipt = n.busy_until + 2 * self.latency(n.nat)
        prev = t.offers.get(n.pid)  # the intake keeps a buffered batch and one pending announcement per peer
        t.offers[n.pid] = [prev[-1], _Offer(n.pid, rnd, gen, arrival, receipt)] if prev else [
            _Offer(n.pid, rnd, gen, arrival, receipt)]
        new_to_t = n.pid not in t.heard
        t.heard[n.pid] = t.rounds
        if self.cfg.arm == "sampled":
            n.view.touch(tid, now)
            if t.view.record(n.pid) is None and n.pid not in t.view.peers():
                t.view.add(n.pid, None, now, now, 1)
            t.view.touch(n.pid, now)
        elif n.pid not in t.viewset:
            t.view.append(n.pid)  # receiver.py: a pusher joins the view
            t.viewset.add(n.pid)
        if new_to_t and t.latest is not None and what != "greets":
            self.push(t, n.pid, "greets")
        return True

    def do_round(self, n: _Node) -> None:
        now, cfg = self.env.now, self.cfg
        n.rounds += 1
        r = n.rounds
        offers = []
        for pair in n.offers.values():
            ready = [o for o in pair if o.arrival <= now]
            if ready and now - ready[-1].generated <= cfg.max_batch_age_s and self.nodes[ready[-1].peer_id].alive:
                offers.append(ready[-1])
        idx = n.gate.choose(offers, cfg.k) if offers else []
        n.gate.start_round(r)
        taken = sorted((offers[i] for i in idx), key=lambda o: n.gate.rank(o.peer_id))
        used = 0
        for o in taken:
            pair = n.offers[o.peer_id]
            pair.remove(o)
            if not pair or pair[-1].round <= o.round:
                del n.offers[o.peer_id]
            relayed = self.nodes[o.peer_id].nat
            self.charge("downloads", self.c.download_overhead, relayed=relayed)
            if relayed and self._in_window():
                self.relay_payload += self.cfg.batch_bytes
            if n.gate.admit(o.peer_id):
                used += 1
                n.gate.passed(o.peer_id, r)
                if self._in_window():
                    self.latencies.append(max(o.receipt, o.arrival) - o.generated)
        if self._in_window():
            self.node_rounds += 1
            self.taken.append(used)
        if n.joiner and n.first_admit is None and used:
            n.first_admit = r
        n.latest = (r, now)
        n.last_targets = self.targets(n)
        for tid in n.last_targets:
            self.push(n, tid)

    def heartbeat(self, n: _Node) -> None:
        now = self.env.now
        n.unreachable.clear()
        for tid in self.targets(n):  # repush to fresh targets (today: a greet's F others when a read was due)
            self.push(n, tid, "repushes")
        if self.cfg.arm == "full":
            if now >= n.next_store:
                self.full_store(n)
            if now >= n.next_read:
                self.full_read(n)
        else:
            if now >= n.next_store:
                self.sampled_store(n)
            if now >= n.next_read:
                self.sampled_read(n)
        # idle_per_conn_s is per connection (control_costs: the swarm's idle rate / its connections), and
        # every connection sits in both ends' tables: each end charges half, so it is counted once
        idle = len(n.conns) * self.cfg.heartbeat_s * self.c.idle_per_conn_s / 2
        self.charge("idle", idle)

    # ---- processes ---------------------------------------------------------------------------------------

    def join(self, n: _Node, warm: bool) -> None:
        """A node's first steps. `warm`: an initial member of a swarm already running (records in place, a
        schedule at a random phase); else a joiner (reads first, then publishes)."""
        now = self.env.now
        if self.cfg.arm == "full":
            if warm:
                self.set_full_view(n, [p for p in self.alive if p != n.pid])
                n.greeted = set(n.view)  # a running swarm's members greeted each other long ago
                p = self.full_period(n)
                phase = self.rng.uniform(0, p)
                for key in (f"{SWARM}_members", f"{SWARM}_batch"):
                    self.put(key, n.pid, now - phase + max(self.cfg.ttl_s, 3 * p), 0, FULL_SUBKEY_CAP)
                n.next_store = now - phase + p
                n.next_read = now + self.rng.uniform(0, p)
            else:
                self.full_store(n)
                self.full_read(n)
            return
        size = len(self.alive) * math.exp(self.rng.uniform(-0.7, 0.7))  # dht_size_estimate, within 2x
        n.level = pol.initial_level(size)
        n.lp = pol.LevelPolicy(n.level)
        if warm:
            phase = self.rng.uniform(0, SAMPLED_STORE_S)
            for key in pol.write_keys(SWARM, str(n.pid), n.level):
                self.put(key, n.pid, now - phase + self.cfg.ttl_s, n.level, pol.SHARD_SUBKEYS)
            n.next_store = now - phase + SAMPLED_STORE_S
            n.next_read = now + self.rng.uniform(0, SAMPLED_READ_S)
            return
        for _ in range(JOIN_READS):
            found = self.sampled_read(n)
            if found:
                break
            n.level = n.lp.level = max(0, n.level - 1)
        self.sampled_store(n)

    def life(self, n: _Node, delay: float, warm: bool):
        yield self.env.timeout(delay)
        self.join(n, warm)
        next_hb = self.env.now + self.rng.uniform(0, self.cfg.heartbeat_s)
        while n.alive:
            self.do_round(n)
            if self.env.now >= next_hb:
                self.heartbeat(n)
                next_hb += self.cfg.heartbeat_s
            yield self.env.timeout(self.cfg.round_s)

    def churn(self):
        rate = 2 * self.cfg.churn_per_min * self.cfg.nodes / 60.0  # leaves and joins per second, half each
        while True:
            yield self.env.timeout(self.rng.expovariate(rate))
            if self.rng.random() < 0.5 and len(self.alive) > 2:
                self.remove_node(self.rng.choice(self.alive))  # a crash: its records stay until they expire
            else:
                n = self.add_node(joiner=True)
                self.env.process(self.life(n, 0.0, warm=False))

    def run(self) -> SimResult:
        cfg = self.cfg
        initial = [self.add_node(joiner=False) for _ in range(cfg.nodes)]
        for i, n in enumerate(initial):
            if cfg.calibration:
                self.env.process(self.life(n, i + self.rng.uniform(0, cfg.round_s), warm=False))
            else:
                self.env.process(self.life(n, self.rng.uniform(0, cfg.round_s), warm=True))
        if cfg.churn_per_min > 0:
            self.env.process(self.churn())
        self.env.run(until=self.t1)
        return self._result()

    def _result(self) -> SimResult:
        cfg, nr = self.cfg, max(self.node_rounds, 1)
        lat = sorted(self.latencies)
        joined = [n for n in self.joiners if self.t0 - 30 <= n.joined_at < self.t1 - 5 * cfg.round_s]
        firsts = sorted(n.first_admit for n in joined if n.first_admit is not None)
        levels: dict[int, int] = {}
        for i in self.alive:
            levels[self.nodes[i].level] = levels.get(self.nodes[i].level, 0) + 1
        return SimResult(
            config=asdict(cfg),
            policy="swarm_node.swarm.sampling",
            control_bytes_per_node_round=sum(self.bytes.values()) / nr,
            components={k: v / nr for k, v in sorted(self.bytes.items())},
            batches_per_round=sum(self.taken) / nr,
            batches_share_of_k=sum(self.taken) / nr / cfg.k,
            rounds_with_k=sum(t >= cfg.k for t in self.taken) / nr,
            latency_median_s=lat[len(lat) // 2] if lat else None,
            latency_p90_s=lat[int(len(lat) * 0.9)] if lat else None,
            joiners=len(joined),
            joiner_first_batch_median_rounds=statistics.median(firsts) if firsts else None,
            joiner_first_batch_p90_rounds=firsts[int(len(firsts) * 0.9)] if firsts else None,
            joiners_without_batch=len(joined) - len(firsts),
            failed_pushes_per_node_round=self.failed_pushes / nr,
            refused_stores=self.refused_stores,
            largest_reply_bytes=self.largest_reply,
            relay_bytes_per_relay_s=(self.relay_bytes + self.relay_payload) / max(self.relays, 1) / cfg.measure_s,
            relays=self.relays,
            node_rounds=self.node_rounds,
            final_levels=dict(sorted(levels.items())),
        )


def simulate(cfg: SimConfig, costs: Costs | None = None) -> SimResult:
    return World(cfg, costs).run()
