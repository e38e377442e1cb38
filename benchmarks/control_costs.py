"""Unit wire costs of the control plane: the bytes one push, download, connection or DHT RPC puts on the wire.

A CLI bootstrap and 3 real swarm peers (hivemind DHT child + p2pd each, `swarm.membership = full`, the
heartbeat held off so that nothing runs but what is measured) on 127.0.0.1, in a network namespace of
our own (tooling/loopback.py): every byte on the loopback interface is ours, TCP/IP headers included.
Each operation runs `--reps` times back to back; its cost is the loopback bytes of that stretch, less
the idle rate (measured before and after, over `--idle-s`) times its duration, divided by the reps.

Measured (docs/data/control_costs.json, flat keys with units in their names):
- a push (one announcement on an open connection), downloads of 1, 4 and 64 KB less the payload, and a
  fresh connection (disconnect, then a push that has to dial again, less a push);
- DHT `call_find` of a key holding 0, 1, 8 and 32 signed member records (a line through them gives the
  bytes per dictionary entry), and one `call_store` of one record;
- hivemind's store and get as swarm/membership.py calls them (beam 4), against a quiet variant done
  here in the DHT child (a lookup of DHTID(key) XOR 1, which no node holds, so no value comes back,
  then `call_store` to the 3 nearest, or `call_find` of the nearest), at 3 and 32 records under the key;
- a steady-state `latest=False` get by a node that is not a replica (hivemind's local cache);
- idle bytes per open connection and second.

    python -m benchmarks.control_costs --json docs/data/control_costs.json
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json
from tooling.loopback import isolate, lo_bytes

SWARM = "costs"
DOWNLOAD_SIZES = (1024, 4096, 65536)
FIND_ENTRIES = (0, 1, 8, 32)
BIG_DICT = 32  # records under the key for the second normal-vs-quiet comparison
RECORD_TTL_S = 600.0  # expiry of the synthetic records (every store of one is newer than the last)


# ---- run in a DHT child (hivemind's run_coroutine: the function is pickled by name into the fork) ----


async def _node_ids(_dht, node) -> tuple[int, list[int]]:
    """This child's DHT node id and those in its routing table (in a swarm this small: every node)."""
    return int(node.node_id), [int(nid) for nid, _pid in node.protocol.routing_table.get_nearest_neighbors(
        node.node_id, k=1000, exclude=node.node_id)]


async def _count_rpcs(_dht, node) -> bool:
    """Wrap this child's call_find / call_store so every RPC it sends is counted (read by _read_rpcs)."""
    proto = node.protocol
    if getattr(proto, "_costs_counts", None) is None:
        proto._costs_counts = {"find": 0, "store": 0}
        find, store = proto.call_find, proto.call_store

        async def counted_find(*a, **k):
            proto._costs_counts["find"] += 1
            return await find(*a, **k)

        async def counted_store(*a, **k):
            proto._costs_counts["store"] += 1
            return await store(*a, **k)

        proto.call_find, proto.call_store = counted_find, counted_store
    return True


async def _read_rpcs(_dht, node) -> dict[str, int]:
    return dict(node.protocol._costs_counts)


async def _finds(peer: str, key: bytes, reps: int, _dht, node) -> tuple[int, int]:
    """`reps` call_find of one key at one peer -> (entries in its answer, neighbour ids in its answer)."""
    from hivemind.dht.routing import DHTID
    from hivemind.p2p import PeerID

    pid, kid = PeerID.from_base58(peer), DHTID.from_bytes(key)
    entries = ids = -1
    for _ in range(reps):
        found = await node.protocol.call_find(pid, [kid])
        value, nearest = found[kid]
        entries = 0 if value is None else len(value.value)
        ids = len(nearest)
    return entries, ids


def _sign(ident: tuple, key: bytes, exp: float) -> bytes:
    """A member record signed by its owner for `key`, as a peer signs its own (ident: private key, subkey,
    serialized record). Signed in the child: hivemind's pipe into it fails on arguments of tens of KB."""
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils.serializer import MSGPackSerializer

    private, subkey, value = ident
    return RSASignatureValidator(private).sign_value(DHTRecord(key, MSGPackSerializer.dumps(subkey), value, exp))


async def _stores(peer: str, key: bytes, ident: tuple, reps: int, _dht, node) -> int:
    """`reps` call_store of one identity's record at one peer, each newer than the last -> accepted."""
    from hivemind.dht.routing import DHTID
    from hivemind.p2p import PeerID

    pid, kid, ok = PeerID.from_base58(peer), DHTID.from_bytes(key), 0
    signed = [(_sign(ident, key, e), e) for e in (time.time() + RECORD_TTL_S + j * 1e-3 for j in range(reps))]
    for value, exp in signed:
        res = await node.protocol.call_store(pid, [kid], [value], [exp], subkeys=[ident[1]])
        ok += bool(res and res[0])
    return ok


async def _quiet_nearest(node, kid, k: int = 3, beam: int = 4) -> dict:
    """The k nodes nearest to `kid` (self included), found by a lookup of kid ^ 1: no node holds that id,
    so no answer carries a value, yet the XOR order near it is the key's own."""
    from hivemind.dht.routing import DHTID

    probe = DHTID(int(kid) ^ 1)
    return (await node.find_nearest_nodes([probe], k_nearest=k, beam_size=beam))[probe]


async def _quiet_stores(key: bytes, ident: tuple, reps: int, _dht, node) -> int:
    """`reps` quiet stores of one identity's record: a lookup of key ^ 1, then call_store to the 3 nearest
    (our own storage when we are one) -> replicas that accepted."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord

    kid, ok = DHTID.from_bytes(key), 0
    signed = [(_sign(ident, key, e), e) for e in (time.time() + RECORD_TTL_S + j * 1e-3 for j in range(reps))]
    for value, exp in signed:
        for nid, pid in (await _quiet_nearest(node, kid)).items():
            if nid == node.node_id:
                record = DHTRecord(key, node.protocol.serializer.dumps(ident[1]), value, exp)
                if node.protocol.record_validator.validate(record):
                    ok += bool(node.protocol.storage.store(kid, value, exp, subkey=ident[1]))
            else:
                res = await node.protocol.call_store(pid, [kid], [value], [exp], subkeys=[ident[1]])
                ok += bool(res and res[0])
    return ok


async def _quiet_reads(key: bytes, reps: int, _dht, node) -> int:
    """Quiet reads: a lookup of key ^ 1, then call_find of the key at the nearest other node (a replica
    that is itself the nearest would read its own storage; this measures the remote read) -> entries."""
    from hivemind.dht.routing import DHTID

    kid, entries = DHTID.from_bytes(key), -1
    for _ in range(reps):
        nearest = [pid for nid, pid in (await _quiet_nearest(node, kid)).items() if nid != node.node_id]
        found = await node.protocol.call_find(nearest[0], [kid])
        value = found[kid][0] if found else None
        entries = 0 if value is None else len(value.value)
    return entries


async def _cache_state(key: bytes, _dht, node) -> dict:
    """Where this child holds the key: its own storage (a replica) or hivemind's local cache."""
    from hivemind.dht.routing import DHTID

    kid = DHTID.from_bytes(key)
    return {"in_storage": node.protocol.storage.get(kid) is not None,
            "in_cache": node.protocol.cache.get(kid) is not None,
            "cache_locally": node.cache_locally, "cache_refresh_before_expiry_s": node.cache_refresh_before_expiry}


# ---- the main process ----


class Meter:
    """Loopback bytes of one stretch of operations, less the idle rate over its duration."""

    def __init__(self) -> None:
        self.idle_bytes_per_s = 0.0

    def idle(self, seconds: float) -> float:
        b0, t0 = lo_bytes(), time.monotonic()
        time.sleep(seconds)
        return (lo_bytes() - b0) / (time.monotonic() - t0)

    def per_op(self, fn: Callable[[], object], reps: int) -> tuple[float, object, float]:
        """(bytes per op, fn's result, seconds per op)."""
        b0, t0 = lo_bytes(), time.monotonic()
        out = fn()
        dt = time.monotonic() - t0
        return (lo_bytes() - b0 - self.idle_bytes_per_s * dt) / reps, out, dt / reps


def identities(n: int) -> list[tuple]:
    """n fresh identities (private key, owner subkey, serialized member record), each with the record it
    would sign (mode, model and task as in benchmarks/swarm_scale.py)."""
    from hivemind.utils.crypto import RSAPrivateKey
    from hivemind.utils.serializer import MSGPackSerializer

    from swarm_node.swarm.records import MemberRecord, peer_id_of_subkey, subkey_for

    out = []
    for i in range(n):
        private = RSAPrivateKey()
        subkey = subkey_for(private)
        record = MemberRecord(peer_id=peer_id_of_subkey(subkey), mode="grpo", model_name=f"synthetic-{i}",
                              tokenizer_fp="tok", task_id="synthetic", round=1000 + i, updated=time.time())
        out.append((private, subkey, MSGPackSerializer.dumps(record.model_dump())))
    return out


def entry_bytes(ident: tuple, key: bytes) -> int:
    """Application bytes of one dictionary entry: serialized subkey plus signed value."""
    from hivemind.utils.serializer import MSGPackSerializer

    return len(MSGPackSerializer.dumps(ident[1])) + len(_sign(ident, key, time.time() + RECORD_TTL_S))


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def key_not_held_by(name_prefix: str, node_ids: dict[str, int], me: str, replicas: int = 3) -> str:
    """A key name whose `replicas` nearest DHT nodes (XOR) leave out `me`: it reads what a non-replica
    reads."""
    from hivemind.dht.routing import DHTID

    for i in range(10_000):
        name = f"{name_prefix}{i}"
        kid = int(DHTID.generate(source=name))
        nearest = sorted(node_ids, key=lambda who: kid ^ node_ids[who])[:replicas]
        if me not in nearest:
            return name
    raise RuntimeError("no key found")


def id_bytes_in_find_reply() -> int:
    """Application bytes one more neighbour id adds to a find answer (hivemind's protobuf, RSA peer ids)."""
    from hivemind.dht.routing import DHTID
    from hivemind.p2p import PeerID
    from hivemind.proto import dht_pb2
    from hivemind.utils.crypto import RSAPrivateKey

    from swarm_node.swarm.records import peer_id_of_subkey, subkey_for

    peer = PeerID.from_base58(peer_id_of_subkey(subkey_for(RSAPrivateKey()))).to_bytes()

    def size(n: int) -> int:
        item = dht_pb2.FindResult(type=dht_pb2.NOT_FOUND)
        for _ in range(n):
            item.nearest_node_ids.append(DHTID.generate().to_bytes())
            item.nearest_peer_ids.append(peer)
        return dht_pb2.FindResponse(results=[item]).ByteSize()

    return (size(20) - size(0)) // 20


def start_peers(boot_maddr: str, n: int) -> list:
    from swarm_node.config import SwarmConfig
    from swarm_node.swarm import PeerInfo, SwarmPeer, keep_raw

    peers = []
    for i in range(n):
        cfg = SwarmConfig(enabled=True, swarm_id=SWARM, initial_peers=[boot_maddr],
                          host_maddrs=["/ip4/127.0.0.1/tcp/0"], membership="full", heartbeat_s=3600.0,
                          bootstrap_retries=5, bootstrap_timeout_s=60)
        # the last peer takes no batches: pushes to it are counted and declined, with no download after them
        validate = keep_raw if i < n - 1 else None
        peers.append(SwarmPeer(cfg, PeerInfo("grpo", f"synthetic-{i}", "tok", "synthetic"), validate=validate).start())
    return peers


def measure(peers: list, args: argparse.Namespace) -> dict:
    from hivemind.dht.routing import DHTID
    from hivemind.p2p import PeerID

    from swarm_node.swarm import announce, transfer
    from swarm_node.swarm.blobs import describe
    from swarm_node.swarm.membership import STORE_BEAM
    from swarm_node.swarm.records import members_key

    a, b, c = peers
    reps = args.reps
    meter = Meter()
    out: dict = {}
    for p in peers:
        p.dht.child.run_coroutine(_count_rpcs)

    def rpcs() -> dict[str, int]:
        return a.dht.child.run_coroutine(_read_rpcs)

    def on_a(coro, timeout: float = 300.0):
        return a.loop.run(coro, timeout)

    def in_a(fn, *fargs):
        return a.dht.child.run_coroutine(functools.partial(fn, *fargs))

    # every pair connected (a push each way), then the idle rate
    frame = announce.encode(announce.BatchAnnouncement(
        kind="batch", round=1, version=0, generated=time.time(), size=3700, sha256="0" * 64, mode="grpo",
        model_name="synthetic-0", tokenizer_fp="tok", task_id="synthetic"))
    for x in peers:
        for y in peers:
            if x is not y:
                x.loop.run(announce.push(x.dht.p2p, y.peer_id, frame, 10.0), 15.0)
    time.sleep(1.0)
    idle_before = meter.idle(args.idle_s)
    meter.idle_bytes_per_s = idle_before
    log(f"idle before: {idle_before:.0f} B/s")

    # a push on an open connection (to the peer that takes no batches: no download follows)
    async def pushes(n: int):
        for _ in range(n):
            await announce.push(a.dht.p2p, c.peer_id, frame, 10.0)

    before = c.stats().get("announcements_in", 0)
    out["push_bytes"], _, push_s = meter.per_op(lambda: on_a(pushes(reps)), reps)
    out["push_ms"] = push_s * 1000
    time.sleep(0.5)  # the receiver counts an announcement after the sender has closed its stream
    out["push_frame_bytes"] = len(frame)
    out["push_check_received"] = c.stats().get("announcements_in", 0) - before
    log(f"push: {out['push_bytes']:.0f} B ({out['push_check_received']} of {reps} received)")

    # downloads: b downloads a's blob of each size
    for size in DOWNLOAD_SIZES:
        payload = os.urandom(size)
        entry = a.blobs.put("batch", describe(100 + size, payload), payload)

        async def downloads(n: int, entry=entry, size=size):
            got = 0
            for _ in range(n):
                body = await transfer.download(b.dht.p2p, a.peer_id, "batch", entry.round, expected_size=size,
                                               expected_sha256=entry.sha256, max_bytes=2**20,
                                               on_received=lambda _n: None, stall_s=10.0)
                got += len(body) == size
            return got

        per, got, _s = meter.per_op(lambda: b.loop.run(downloads(reps), 300.0), reps)
        out[f"download_{size // 1024}k_bytes"] = per
        out[f"download_{size // 1024}k_overhead_bytes"] = per - size
        log(f"download {size} B: {per:.0f} B on the wire, overhead {per - size:.0f} B ({got}/{reps} ok)")
    out["download_overhead_bytes"] = statistics.fmean(out[f"download_{s // 1024}k_overhead_bytes"]
                                                      for s in DOWNLOAD_SIZES[:2])

    # a fresh connection: a disconnects from c, then pushes (it dials again); less a push
    async def reconnects(n: int):
        for _ in range(n):
            await a.dht.p2p._client.disconnect(PeerID.from_base58(c.peer_id))
            await asyncio.sleep(0.05)
            await announce.push(a.dht.p2p, c.peer_id, frame, 10.0)

    conn_reps = max(5, reps // 4)
    per, _, _ = meter.per_op(lambda: on_a(reconnects(conn_reps)), conn_reps)
    out["new_connection_bytes"] = per - out["push_bytes"]
    log(f"new connection: {out['new_connection_bytes']:.0f} B")

    # call_find with 0, 1, 8, 32 entries under a key at b; call_store of one record at b
    t0 = time.monotonic()
    idents = identities(max(FIND_ENTRIES))
    log(f"made {len(idents)} identities in {time.monotonic() - t0:.1f}s")
    out["entry_app_bytes"] = statistics.fmean(entry_bytes(x, DHTID.generate(source=SWARM).to_bytes()) for x in idents)
    finds = {}
    for n_entries in FIND_ENTRIES:
        name = f"{SWARM}_find{n_entries}"
        key = DHTID.generate(source=name).to_bytes()
        if n_entries:
            stored = sum(in_a(_stores, b.peer_id, key, x, 1) for x in idents[:n_entries])
            assert stored == n_entries, (stored, n_entries)
        per, (entries, ids), _ = meter.per_op(lambda key=key: in_a(_finds, b.peer_id, key, reps), reps)
        finds[n_entries] = per
        out[f"find_{n_entries}_entries_bytes"] = per
        out["find_reply_ids"] = ids
        assert entries == n_entries, (entries, n_entries)
        log(f"call_find, {n_entries} entries: {per:.0f} B ({ids} neighbour ids in the answer)")
    base, slope = fit_line(list(finds), list(finds.values()))
    out["find_base_bytes"], out["find_per_entry_bytes"] = base, slope
    out["find_per_id_app_bytes"] = id_bytes_in_find_reply()

    skey = DHTID.generate(source=f"{SWARM}_store").to_bytes()
    per, ok, _ = meter.per_op(lambda: in_a(_stores, b.peer_id, skey, idents[0], reps), reps)
    out["store_rpc_bytes"] = per
    log(f"call_store of one record: {per:.0f} B ({ok}/{reps} accepted)")

    # hivemind's store / get as membership.py uses them vs quiet ones, with the 3 peers' records plus 1
    # (the identity the quiet stores write) under the members key, then with BIG_DICT records
    mkey = members_key(SWARM)
    mkey_bytes = DHTID.generate(source=mkey).to_bytes()
    quiet_ident = idents[-1]
    for extra in (1, BIG_DICT - 3):
        for x in [quiet_ident] if extra == 1 else idents[:extra - 1]:
            in_a(_quiet_stores, mkey_bytes, x, 1)
        record = a.membership.record().model_dump()
        d = len(a.dht.call("get", mkey, latest=True).value)
        label = f"{d}_entries"

        def normal_stores(n: int, record=record):  # newer than the record the start-up heartbeat stored
            return sum(bool(a.dht.call("store", mkey, record, time.time() + 4 * 3600.0, subkey=a.dht.subkey,
                                       beam_size=STORE_BEAM)) for _ in range(n))

        def normal_gets(n: int):
            got = -1
            for _ in range(n):
                found = a.dht.call("get", mkey, latest=True, beam_size=STORE_BEAM)
                got = len(found.value) if found is not None else 0
            return got

        for what, fn in (("hivemind_store", lambda: normal_stores(reps)),
                         ("quiet_store", lambda: in_a(_quiet_stores, mkey_bytes, quiet_ident, reps)),
                         ("hivemind_get_latest", lambda: normal_gets(reps)),
                         ("quiet_read", lambda: in_a(_quiet_reads, mkey_bytes, reps))):
            r0 = rpcs()
            per, res, _ = meter.per_op(fn, reps)
            r1 = rpcs()
            out[f"{what}_{label}_bytes"] = per
            out[f"{what}_{label}_find_rpcs"] = (r1["find"] - r0["find"]) / reps
            out[f"{what}_{label}_store_rpcs"] = (r1["store"] - r0["store"]) / reps
            log(f"{what}, {d} entries under the key: {per:.0f} B, {out[f'{what}_{label}_find_rpcs']:.1f} find + "
                f"{out[f'{what}_{label}_store_rpcs']:.1f} store RPCs (result {res})")
        out[f"quiet_lookup_{label}_bytes"] = (out[f"quiet_store_{label}_bytes"]
                                             - out[f"quiet_store_{label}_store_rpcs"] * out["store_rpc_bytes"])

    # a steady-state latest=False get by a node that is not a replica of the key
    mine, others = a.dht.child.run_coroutine(_node_ids)
    node_ids = {"a": mine, **{f"n{i}": x for i, x in enumerate(others)}}
    out["dht_nodes"] = len(node_ids)
    cname = key_not_held_by(f"{SWARM}_cache", node_ids, "a")
    ckey = DHTID.generate(source=cname).to_bytes()
    for x in idents[:8]:
        b.dht.child.run_coroutine(functools.partial(_quiet_stores, ckey, x, 1))
    per_first, first, _ = meter.per_op(lambda: a.dht.call("get", cname, latest=False), 1)
    state = a.dht.child.run_coroutine(functools.partial(_cache_state, ckey))
    r0 = rpcs()
    per, found, _ = meter.per_op(lambda: [a.dht.call("get", cname, latest=False) for _ in range(reps)][-1], reps)
    r1 = rpcs()
    out["get_cached_first_bytes"] = per_first
    out["get_cached_steady_bytes"] = per
    out["get_cached_steady_finds"] = (r1["find"] - r0["find"]) / reps
    out["get_cached_entries"] = len(found.value) if found is not None else 0
    out["get_cached_reader_is_replica"] = state["in_storage"]
    out["get_cached_in_local_cache"] = state["in_cache"]
    out["hivemind_cache_locally"] = state["cache_locally"]
    out["hivemind_cache_refresh_before_expiry_s"] = state["cache_refresh_before_expiry_s"]
    log(f"latest=False get, not a replica: first {per_first:.0f} B, then {per:.0f} B per get "
        f"({out['get_cached_steady_finds']:.2f} finds), cached: {state}")

    # idle bytes per open connection and second
    time.sleep(1.0)
    idle_after = meter.idle(args.idle_s)
    pairs = set()
    for p in peers:
        for info in p.loop.run(p.dht.p2p.list_peers(), 10.0):
            pairs.add(frozenset((p.peer_id, info.peer_id.to_base58())))
    out["idle_bytes_per_s_before"], out["idle_bytes_per_s_after"] = idle_before, idle_after
    out["connections"] = len(pairs)
    out["idle_bytes_per_conn_s"] = (idle_before + idle_after) / 2 / max(len(pairs), 1)
    log(f"idle after: {idle_after:.0f} B/s over {len(pairs)} connections")
    return out


def log(msg: str) -> None:
    print(msg, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=100, help="repetitions of each operation")
    ap.add_argument("--idle-s", type=float, default=15.0, help="seconds of each idle-rate window")
    ap.add_argument("--no-netns", dest="netns", action="store_false",
                    help="do not isolate loopback (the counts then include every other process's traffic)")
    add_run_args(ap, seeds=1, quick="20 repetitions, 5 s idle windows",
                 seeds_help="passes over every measurement (each with fresh peers); the JSON keeps the median")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    if args.quick:
        args.reps, args.idle_s = 20, 5.0
    code = isolate(args, "benchmarks.control_costs", "counting every loopback byte on this machine")
    if code is not None:
        return code
    for name in ("hivemind", "swarm_node"):  # the set-up pushes' refused downloads are expected
        logging.getLogger(name).setLevel(logging.ERROR)
    t_start = time.time()
    passes = []
    for seed in seeds:
        passes.append(one_pass(args, seed))
    keys = [k for k, v in passes[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    summary = {k: statistics.median(p[k] for p in passes) for k in keys}
    summary.update({k: v for k, v in passes[0].items() if k not in summary})
    print("\n| cost | bytes |\n|---|---|")
    for k in sorted(summary):
        v = summary[k]
        print(f"| {k} | {v:,.1f} |" if isinstance(v, float) else f"| {k} | {v} |")
    wall = round(time.time() - t_start, 1)
    print(f"\nwall time {wall} s")
    write_json(args.json, {"args": public_args(args, drop=("json",)), "netns": args.netns, "wall_s": wall,
                           **summary, "passes": passes if len(passes) > 1 else []}, args)
    return 0


def one_pass(args: argparse.Namespace, seed: int) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    boot = subprocess.Popen([sys.executable, "-m", "swarm_node.cli", "bootstrap", "--host-maddrs",
                             "/ip4/127.0.0.1/tcp/0", "--swarm", SWARM], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    peers: list = []
    try:
        maddr = boot.stdout.readline().strip()
        t0 = time.monotonic()
        peers = start_peers(maddr, 3)
        log(f"pass {seed}: bootstrap and 3 peers up in {time.monotonic() - t0:.1f}s")
        return measure(peers, args)
    finally:
        for p in peers:
            p.close()
        boot.send_signal(signal.SIGINT)
        try:
            boot.wait(20)
        except subprocess.TimeoutExpired:
            boot.kill()


if __name__ == "__main__":
    raise SystemExit(main())
