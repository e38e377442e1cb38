"""DPO nodes as real processes on 127.0.0.1: a gossip ring that survives a killed neighbour, and federated.

Each node is `python -m swarm_node.cli run` joined through `python -m swarm_node.cli bootstrap`, on a tiny
un-warmed Llama saved with save_pretrained (loaded through the same path as a real checkpoint).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = '["/ip4/127.0.0.1/tcp/0"]'


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from swarm_node.models.factory import Preset, build_model, build_tokenizer

    out = tmp_path_factory.mktemp("dpo-model")
    tok = build_tokenizer()
    pre = Preset("llama", hidden=32, layers=2, heads=2, kv_heads=2, intermediate=64, lr_full=1e-3, lr_lora=1e-3)
    build_model(pre, len(tok), tok.pad_token_id, tok.eos_token_id, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _bootstrap(swarm: str, tmp: Path) -> tuple[subprocess.Popen, str]:
    boot = subprocess.Popen(
        [sys.executable, "-m", "swarm_node.cli", "bootstrap", "--host-maddrs", "/ip4/127.0.0.1/tcp/0",
         "--swarm", swarm],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=open(tmp / "boot.err", "w"), text=True,
        start_new_session=True,
    )
    maddr = boot.stdout.readline().strip()
    assert "/p2p/" in maddr, (maddr, (tmp / "boot.err").read_text())
    return boot, maddr


def _node(i: int, tmp: Path, maddr: str, model_dir: Path, sets: list[str], config: str | None = None):
    args = [sys.executable, "-m", "swarm_node.cli", "run", "--state-dir", str(tmp / f"s{i}"),
            "--initial-peers", maddr, "--log-level", "info"]
    if config:
        args += ["--config", config]
    common = ["mode=dpo", f"model.path={model_dir}", f"swarm.host_maddrs={LOOPBACK}", "swarm.heartbeat_s=1",
              "swarm.record_ttl_s=6", "swarm.bootstrap_timeout_s=10", "dpo.gossip_deadline_s=4",
              "dpo.join_wait_s=60", "metrics.eval_every=1"]
    for s in common + sets:
        args += ["--set", s]
    return subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=open(tmp / f"n{i}.log", "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _rows(tmp: Path, i: int) -> list[dict]:
    f = tmp / f"s{i}" / "metrics.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def _kill_group(p: subprocess.Popen) -> None:
    """SIGKILL a node and its DHT child + p2pd (a SIGKILLed parent leaves its forked children running)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(10)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(p)  # sweeps leftovers of nodes that exited or were killed


def test_gossip_ring_learns_and_survives_a_killed_neighbour(tmp_path: Path, model_dir: Path) -> None:
    rounds, victim = 36, 3
    boot, maddr = _bootstrap("dpo-demo", tmp_path)
    procs: list[subprocess.Popen] = []
    try:
        for i in range(4):
            sets = [f"rounds={rounds}", "swarm.swarm_id=dpo-demo", "dpo.min_peers=4"]
            procs.append(_node(i, tmp_path, maddr, model_dir, sets, config=str(ROOT / f"peers/dpo-ring-{i}.yaml")))
        end = time.monotonic() + 120
        while len(_rows(tmp_path, victim)) < 12 and time.monotonic() < end:
            assert procs[victim].poll() is None, (tmp_path / f"n{victim}.log").read_text()[-3000:]
            time.sleep(0.2)
        _kill_group(procs[victim])  # SIGKILL: no goodbye, its records linger until their TTL
        for i, p in enumerate(procs):
            if i != victim:
                assert p.wait(150) == 0, (tmp_path / f"n{i}.log").read_text()[-3000:]
    finally:
        _stop(procs + [boot])
    survivors = [i for i in range(4) if i != victim]
    for i in survivors:
        rows = _rows(tmp_path, i)
        assert [r["round"] for r in rows] == list(range(rounds)), f"node {i}"
        assert rows[0]["graph"] == "ring" and rows[0]["num_peers"] == 4
        early = sum(r["consensus_distance"] for r in rows[:3]) / 3
        late = sum(r["consensus_distance"] for r in rows[8:12]) / 4
        assert late < early, (i, early, late)
        start, final = rows[0]["heldout_pref_acc"], rows[-1]["heldout_pref_acc"]
        assert final > start + 0.1 and final > 0.7, (i, start, final)
        assert rows[-1]["num_peers"] == 3  # the dead peer's record expired; the ring was rebuilt on 3
        assert rows[1]["bytes_received"] > 0 and rows[1]["payload_bytes"] > 0
    # the killed node's ring neighbours noticed and went on with a re-weighted average
    missed = [r for i in survivors for r in _rows(tmp_path, i) if r["missing_neighbours"]]
    assert missed, "no survivor reported the killed neighbour missing"


@pytest.mark.parametrize("backend", ["published", "allreduce"])
def test_federated_nodes_end_each_round_identical(tmp_path: Path, model_dir: Path, backend: str) -> None:
    rounds = 8
    boot, maddr = _bootstrap("dpo-fed", tmp_path)
    procs = []
    try:
        for i in range(3):
            sets = [f"rounds={rounds}", f"seed={i}", f"dpo.user={i}", "swarm.swarm_id=dpo-fed",
                    "dpo.averaging=federated", "dpo.min_peers=3", "dpo.lr=0.003", "dpo.batch_size=16",
                    f"dpo.federated_backend={backend}", "dpo.gossip_deadline_s=15"]
            if backend == "allreduce":  # hivemind's all-reduce cannot clip: trusted swarms only
                sets.append("dpo.aggregation=mean")
            procs.append(_node(i, tmp_path, maddr, model_dir, sets))
        for i, p in enumerate(procs):
            assert p.wait(150) == 0, (tmp_path / f"n{i}.log").read_text()[-3000:]
    finally:
        _stop(procs + [boot])
    runs = [_rows(tmp_path, i) for i in range(3)]
    together = 0  # rounds in which all three averaged with each other
    for r in range(rounds):
        assert all(rows[r]["graph"] == "federated" for rows in runs), r
        if backend == "published":  # the same bytes, summed in the same order: bit-identical
            assert all(len(rows[r]["neighbours"]) == 2 for rows in runs), r
            digests = {rows[r]["params_digest"] for rows in runs}
            assert len(digests) == 1, f"round {r}: nodes disagree {digests}"
        else:  # each node reduces one part itself: equal up to float16 compression error
            full = [rows[r] for rows in runs if len(rows[r]["neighbours"]) == 2]
            together += len(full) == 3
            probes = [row["params_probe"] for row in full]
            for a, b in zip(probes, probes[1:], strict=False):
                assert a == pytest.approx(b, rel=1e-3, abs=0.05), (r, probes)
    if backend == "allreduce":
        # on a loaded machine hivemind now and then loses a part or stalls (CI, 2026-12-05): those nodes keep
        # their own parameters for the round and say so (their rows list fewer neighbours). Rarer, a node's
        # DHT child fails every later request (see docs/dpo.md), which ends the averaging for the rest of
        # the run. Either way the swarm averaged together in most rounds.
        assert together >= rounds - 3, [[len(rows[r]["neighbours"]) for rows in runs] for r in range(rounds)]
    if backend == "published":  # identical models evaluate identically on the shared held-out set
        assert len({rows[-1]["heldout_pref_acc"] for rows in runs}) == 1


def test_sigterm_finishes_the_round_and_exits_zero(tmp_path: Path, model_dir: Path) -> None:
    """No swarm, no round limit: SIGTERM ends the node after a complete, logged round, with exit code 0."""
    args = [sys.executable, "-m", "swarm_node.cli", "run", "--state-dir", str(tmp_path / "s0")]
    for s in ["mode=dpo", f"model.path={model_dir}", "dpo.pairs_per_user=64", "dpo.heldout_pairs=64"]:
        args += ["--set", s]
    proc = subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=open(tmp_path / "n0.log", "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        end = time.monotonic() + 60
        while len(_rows(tmp_path, 0)) < 3 and time.monotonic() < end:
            assert proc.poll() is None, (tmp_path / "n0.log").read_text()[-3000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "n0.log").read_text()[-3000:]
    finally:
        _stop([proc])
    rows = _rows(tmp_path, 0)
    assert [r["round"] for r in rows] == list(range(len(rows)))
    assert rows[-1]["heldout_pref_acc"] is not None  # the interrupted round was evaluated and logged


def test_a_restarted_ring_node_resumes_and_catches_up_with_its_neighbours(tmp_path: Path, model_dir: Path) -> None:
    """3-node ring; node 2 is stopped mid-run (SIGTERM during a gossip round) and started again with the same
    --state-dir. It resumes from its checkpoint, skips to the round its neighbours are in (rather than asking
    them for rounds they finished long ago), and averages with them again; every node logs each round once.

    The neighbours learn of the restarted node from the DHT a few of their (sub-second) rounds after it is
    back, more on a loaded machine, so the test waits until each of them has averaged with it in 8 rounds
    (bounded) and judges the rounds from the first one in which it did, instead of a fixed window that a
    slow membership read on a loaded machine could leave half empty (CI, 2026-12-02: 6 of 10)."""
    victim = 2
    boot, maddr = _bootstrap("dpo-resume", tmp_path)
    procs: list[subprocess.Popen] = []

    def sets(i: int) -> list[str]:  # no round limit: the test stops every node with SIGTERM
        return ["swarm.swarm_id=dpo-resume", "dpo.min_peers=3", f"dpo.user={i}", "dpo.lr=0.003",
                "checkpoint.every_rounds=5", f"swarm.identity_path={tmp_path / f'id{i}.key'}"]

    def wait_for(i: int, done, proc: subprocess.Popen, what: str) -> None:
        end = time.monotonic() + 180
        while not done(_rows(tmp_path, i)) and time.monotonic() < end:
            assert proc.poll() is None, (tmp_path / f"n{i}.log").read_text()[-3000:]
            time.sleep(0.1)
        assert done(_rows(tmp_path, i)), f"node {i}: {what}"

    try:
        procs = [_node(i, tmp_path, maddr, model_dir, sets(i)) for i in range(3)]
        wait_for(victim, lambda rows: len(rows) >= 8, procs[victim], "8 rounds")
        procs[victim].send_signal(signal.SIGTERM)
        assert procs[victim].wait(60) == 0, (tmp_path / f"n{victim}.log").read_text()[-3000:]
        last_before = _rows(tmp_path, victim)[-1]["round"]
        wait_for(0, lambda rows: len(rows) >= last_before + 9, procs[0], "going on alone")
        (tmp_path / f"n{victim}.log").rename(tmp_path / f"n{victim}-first.log")
        procs[victim] = _node(victim, tmp_path, maddr, model_dir, sets(victim))
        wait_for(victim, lambda rows: sum(r["round"] > last_before for r in rows) >= 12, procs[victim],
                 "12 rounds after the restart")
        victim_id = _rows(tmp_path, victim)[-1]["peer_id"]
        for i in (0, 1):
            wait_for(i, lambda rows: sum(victim_id in r["neighbours"] for r in rows[last_before + 1:]) >= 8,
                     procs[i], "8 rounds averaged with the restarted node")
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for i, p in enumerate(procs):
            assert p.wait(60) == 0, (tmp_path / f"n{i}.log").read_text()[-3000:]
    finally:
        _stop(procs + [boot])
    log = (tmp_path / f"n{victim}.log").read_text()
    assert f"continuing at round {last_before + 1}" in log, log[-3000:]
    assert "catching up from round" in log, log[-3000:]
    rows = _rows(tmp_path, victim)
    got = [r["round"] for r in rows]
    assert got == sorted(set(got)), got  # each round once, increasing
    assert got[: last_before + 1] == list(range(last_before + 1))
    resumed_at = got[last_before + 1]
    assert resumed_at >= last_before + 9, (last_before, resumed_at)  # skipped to the neighbours' round
    after = [r for r in rows if r["round"] > resumed_at + 2]
    assert after and sum(len(r["neighbours"]) == 2 for r in after) >= 0.7 * len(after), after
    for i in (0, 1):
        rows_i = _rows(tmp_path, i)
        assert [r["round"] for r in rows_i] == list(range(len(rows_i))), f"node {i}"
        # from the first round after the restart in which node i averaged with the victim again
        first = next(r["round"] for r in rows_i if r["round"] >= resumed_at and victim_id in r["neighbours"])
        back = [r for r in rows_i if first <= r["round"] <= rows[-1]["round"]]
        assert sum(victim_id in r["neighbours"] for r in back) >= 0.7 * len(back), \
            (i, first, [(r["round"], r["neighbours"], r["missing_neighbours"]) for r in back])


def _beside_a_scaling_adversary(tmp_path: Path, model_dir: Path, swarm: str, sets: list[str], rounds: int = 20,
                                honest: int = 4) -> tuple[dict, list[list[dict]]]:
    """`honest` real DPO nodes (users 0..honest-1, `dpo.aggregation=clipped`) and tooling/dpo_adversary.py in
    mode `scaled` (its neighbours' parameters x 1e3) on a ring of honest + 1; returns the adversary's report
    and each honest node's metrics rows."""
    boot, maddr = _bootstrap(swarm, tmp_path)
    procs: list[subprocess.Popen] = []
    common = [f"swarm.swarm_id={swarm}", f"dpo.min_peers={honest + 1}", "dpo.lr=0.003", "dpo.batch_size=16",
              "dpo.aggregation=clipped", *sets]
    report = tmp_path / "adversary.json"
    try:
        for i in range(honest):
            # the adversary publishes round r only once it has its neighbours' round r: 10 s, not 4, for it
            # to come in time on a loaded machine (a late payload is missing, not refused)
            procs.append(_node(i, tmp_path, maddr, model_dir, [f"rounds={rounds}", f"seed={i}", f"dpo.user={i}", *common,
                                                               "dpo.gossip_deadline_s=10"]))
        adv_sets = ["swarm.heartbeat_s=1", "swarm.record_ttl_s=6", "dpo.gossip_deadline_s=4", *common]
        adv = subprocess.Popen(
            [sys.executable, str(ROOT / "tooling" / "dpo_adversary.py"), "--model-dir", str(model_dir), "--maddr", maddr,
             "--swarm-id", swarm, "--mode", "scaled", "--rounds", str(rounds), "--out", str(report),
             "--state-dir", str(tmp_path / "adv"), *[a for s in adv_sets for a in ("--set", s)]],
            cwd=ROOT, env=_env(), stdout=open(tmp_path / "adv.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(adv)
        for i, p in enumerate(procs[:honest]):
            assert p.wait(240) == 0, (tmp_path / f"n{i}.log").read_text()[-3000:]
        assert adv.wait(60) == 0, (tmp_path / "adv.log").read_text()[-3000:]
    finally:
        _stop(procs + [boot])
    bad = json.loads(report.read_text())
    assert bad["rounds"], (tmp_path / "adv.log").read_text()[-3000:]
    runs = [_rows(tmp_path, i) for i in range(honest)]
    for rows in runs:
        assert [r["round"] for r in rows] == list(range(rounds))
        assert all(math.isfinite(v) for r in rows for v in r["params_probe"])
        assert all(bad["peer_id"] not in r["neighbours"] for r in rows)  # never averaged in
    return bad, runs


def _refused_in_nearly_every_attacked_round(rows: list[dict], bad: dict) -> None:
    """A node beside the adversary counted it `norm_outlier` in every round it published but one (a late
    payload is missing, not refused)."""
    attacked = [r for r in rows if r["round"] in bad["rounds"]]
    refused = sum(r["rejected"].get("params:norm_outlier", 0) for r in rows)  # rows count each round's
    assert refused >= len(attacked) - 1, [r["rejected"] for r in rows]


def test_honest_ring_nodes_refuse_a_real_hostile_neighbour(tmp_path: Path, model_dir: Path) -> None:
    """4 honest nodes (users 0-3, `dpo.aggregation=clipped`) and tooling/dpo_adversary.py on a 5-node ring, as
    real processes: the adversary follows its neighbours' rounds and publishes their parameters x 1e3. Its two
    ring neighbours refuse it (`norm_outlier`) from round 0 (their first update gives the scale) and, from
    round 3 (`dpo.bypass_after`), route around it: they average with each other, so the honest nodes form a
    4-node ring instead of a path. Their parameters stay at their own scale (plain averaging would take a
    third of the x 1e3 payload every round).

    Not asserted: that they learn (one run, 2026-12-04, with the bypass: held-out preference accuracy
    0.54-0.57 -> 0.77-0.98 in 20 rounds)."""
    rounds = 20
    # dpo.min_neighbours=0: the ring as it is (the default would widen a 5-node ring to the complete graph),
    # since what this test watches is the ring closing around the refused node
    bad, runs = _beside_a_scaling_adversary(tmp_path, model_dir, "dpo-byz", ["dpo.min_neighbours=0"], rounds)
    beside = [rows for rows in runs if bad["peer_id"] in rows[0]["neighbours"] + rows[0]["missing_neighbours"]]
    assert len(beside) == 2  # a 5-node ring: the adversary has two honest neighbours
    # the parameters' scale: round 0 of the nodes the adversary is not beside
    scale = max(abs(v) for rows in runs if rows not in beside for v in rows[0]["params_probe"])
    for rows in runs:
        assert max(abs(v) for r in rows for v in r["params_probe"]) < 10 * scale, [r["params_probe"] for r in rows]
    for rows in beside:
        _refused_in_nearly_every_attacked_round(rows, bad)
        # its honest neighbour every round and, once it has been refused dpo.bypass_after (3) rounds in a row,
        # the adversary's other neighbour too: the ring closes around it (dpo/bypass.py)
        around = [r for r in rows if r["routed_around"] == [bad["peer_id"]]]
        assert len(around) >= 0.7 * rounds, [(r["round"], r["routed_around"], r["neighbours"]) for r in rows]
        other = next(o for o in beside if o is not rows)[0]["peer_id"]
        # every such round plans the other side; it is averaged in unless its payload came late (one round of
        # one node in a CI run of 2026-12-04 on a loaded 2-core machine), hence most rounds, not all
        assert all(other in r["neighbours"] + r["missing_neighbours"] for r in around), \
            [(r["round"], r["neighbours"], r["missing_neighbours"]) for r in around]
        averaged = [r for r in around if len(r["neighbours"]) == 2 and other in r["neighbours"]]
        assert len(averaged) >= 0.8 * len(around), [(r["round"], r["neighbours"]) for r in around]


def test_the_default_widened_ring_refuses_a_real_hostile_neighbour_and_learns(tmp_path: Path, model_dir: Path) -> None:
    """The same 5-node ring with the default `dpo.min_neighbours` (3): under the clipped rule every node also
    averages with its second neighbours, which on 5 nodes is the complete graph, so every honest node is beside
    the x 1e3 adversary, refuses it (`norm_outlier`) in every round it publishes (but one: a late payload is missing), and averages with the other
    three honest nodes. They learn as a swarm: every node's held-out preference accuracy rises by more than 0.1
    to over 0.9 (one run, 2026-12-06: 0.70-0.75 -> 0.992 at every node in 20 rounds, the same to three
    decimals as the 4 honest nodes alone; the plain 4-node ring, `dpo.aggregation=mean`: 0.56-0.62 ->
    0.96-0.99). Fails with plain averaging (the x 1e3 payload is averaged in) or without the widening (two
    honest nodes are not beside it)."""
    rounds = 20
    bad, runs = _beside_a_scaling_adversary(tmp_path, model_dir, "dpo-byz-wide", [], rounds)
    for rows in runs:
        assert {len(r["neighbours"]) + len(r["missing_neighbours"]) for r in rows} == {4}  # the complete graph
        _refused_in_nearly_every_attacked_round(rows, bad)
        start, final = rows[0]["heldout_pref_acc"], rows[-1]["heldout_pref_acc"]
        assert final > start + 0.1 and final > 0.9, (rows[0]["peer_id"], start, final)
