"""Faults on real processes: SIGTERM inside a training step, a disk that fills up while a checkpoint is written.

Each node is `python -m swarm_node.cli run` (swarm disabled: the faults are local ones). The tests watch the
node's debug log for the line logged just before its training step and signal it then; the node's own
"SIGTERM received (in ...)" line names the functions the signal landed in, which proves where it landed.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from swarm_node.node.metrics import read_metrics
from swarm_node.runs.local_swarm import Peer, child_env, cli, stop_process, write_peer_config
from tooling.full_disk import FileSizeLimit, mount_tmpfs, tmpfs_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def presets(presets_dir: Path) -> Path:
    return presets_dir


def _tail(path: Path, n: int = 30) -> str:
    return "".join(path.read_text().splitlines(keepends=True)[-n:]) if path.exists() else "[no log]"


def _signal_on_line(proc: subprocess.Popen, log: Path, pattern: str, min_round: int, timeout_s: float) -> int:
    """Send SIGTERM to `proc` the moment `log` gets a line matching `pattern` (group 1: a round >= min_round)."""
    rx = re.compile(pattern)
    end = time.monotonic() + timeout_s
    pos = 0
    while time.monotonic() < end:
        assert proc.poll() is None, f"node exited early ({proc.returncode})\n{_tail(log)}"
        if log.exists():
            with open(log) as fh:
                fh.seek(pos)
                chunk = fh.read()
            cut = chunk.rfind("\n") + 1
            pos += len(chunk[:cut].encode())
            for line in chunk[:cut].splitlines():
                m = rx.search(line)
                if m and int(m.group(1)) >= min_round:
                    proc.send_signal(signal.SIGTERM)
                    return int(m.group(1))
        time.sleep(0.005)
    raise AssertionError(f"no line matching {pattern!r} within {timeout_s}s\n{_tail(log)}")


def _stop_inside_step(peer: Peer, step_line: str, step_fn: str, first_round: int, attempts: int = 4) -> tuple[int, str]:
    """Start the node, SIGTERM it inside its training step, check a clean exit; retry (resuming) if the signal
    landed outside the step. Returns (the round that was being trained, the node's 'received' line)."""
    for _ in range(attempts):
        peer.start(None, log_level="debug")
        log = peer.log_path
        start = len(log.read_text()) if log.exists() else 0
        try:
            r = _signal_on_line(peer.proc, log, step_line, first_round, timeout_s=240)
            assert peer.proc.wait(120) == 0, _tail(log)
        finally:
            if peer.running():
                stop_process(peer.proc, grace_s=5)
        text = log.read_text()[start:]
        assert "Traceback" not in text, text[-3000:]
        got = re.search(r"SIGTERM received \(in ([^)]*)\)", text)
        assert got, text[-3000:]
        if re.search(rf"\b{step_fn}\b", got.group(1)):
            return r, got.group(0)
        first_round = r + 1  # landed just outside the step (a step with nothing to train is instant): again
    raise AssertionError(f"the signal never landed inside {step_fn} in {attempts} attempts")


def _run_until_done(peer: Peer, extra_args: list[str]) -> str:
    """Start the node with `extra_args`, wait for its clean exit, and return what it logged (no traceback)."""
    start = len(peer.log_path.read_text()) if peer.log_path is not None and peer.log_path.exists() else 0
    peer.extra_args = extra_args
    peer.start(None)
    try:
        assert peer.proc.wait(300) == 0, _tail(peer.log_path)
    finally:
        if peer.running():
            stop_process(peer.proc, grace_s=5)
    text = peer.log_path.read_text()[start:]
    assert "Traceback" not in text, text[-3000:]
    return text


def _check_resumes(peer: Peer, ck_round: int, next_round: int, rounds: int) -> None:
    """The checkpoint is the stopped round's, and a restart continues right after it to the end."""
    from swarm_node.node.checkpoint import latest_checkpoint

    assert latest_checkpoint(peer.state_dir).round == ck_round
    text = _run_until_done(peer, [*peer.extra_args, "--set", f"rounds={rounds}"])
    assert f"continuing at round {next_round}" in text, _tail(peer.log_path)


def test_sigterm_inside_the_grpo_training_step(presets: Path, tmp_path: Path) -> None:
    """A GRPO node signalled while FTISTrainer.step runs finishes that step and round, checkpoints it, exits 0,
    and the checkpoint resumes at the next round."""
    ov = {"rounds": None, "swarm.enabled": False, "task.prompts_per_round": 16, "task.eval_n": 20,
          "generation.num_generations": 8, "generation.max_new_tokens": 16, "training.steps_per_round": 6,
          "metrics.eval_every": 1000, "checkpoint.every_rounds": 1000}
    cfg = write_peer_config(ROOT / "peers" / "tiny-s.yaml", tmp_path / "grpo.yaml", ov)
    peer = Peer(name="grpo", config=cfg, state_dir=tmp_path / "grpo")
    r, line = _stop_inside_step(peer, r"round (\d+): training step on", "step", first_round=2)
    text = peer.log_path.read_text()
    assert f"stopping after round {r}" in text, (line, _tail(peer.log_path))
    rows = read_metrics(peer.metrics)
    assert [x["round"] for x in rows] == list(range(r + 1))  # the interrupted round finished and was logged
    _check_resumes(peer, ck_round=r, next_round=r + 1, rounds=r + 2)
    assert [x["round"] for x in read_metrics(peer.metrics)] == list(range(r + 3))


def test_sigterm_inside_the_dpo_local_steps(presets: Path, tmp_path: Path) -> None:
    """The same for a DPO node: the signal lands in DPOTrainer.local_steps; the round ends evaluated and saved."""
    sets = ["mode=dpo", "model.path=tiny-s", "swarm.enabled=false", "dpo.averaging=none", "dpo.user=1",
            "dpo.pairs_per_user=64", "dpo.heldout_pairs=16", "dpo.local_steps=40", "dpo.batch_size=16",
            "metrics.eval_every=1000", "checkpoint.every_rounds=1000"]
    cfg = tmp_path / "dpo.yaml"
    cfg.write_text("mode: dpo\n")
    peer = Peer(name="dpo", config=cfg, state_dir=tmp_path / "dpo",
                extra_args=[a for s in sets for a in ("--set", s)])
    r, line = _stop_inside_step(peer, r"round (\d+): \d+ local DPO steps", "local_steps", first_round=1)
    assert f"stopping after round {r}" in peer.log_path.read_text(), (line, _tail(peer.log_path))
    rows = read_metrics(peer.metrics)
    assert [x["round"] for x in rows] == list(range(r + 1))
    assert rows[-1]["heldout_pref_acc"] is not None  # the stopped round is evaluated
    _check_resumes(peer, ck_round=r, next_round=r + 1, rounds=r + 3)
    assert [x["round"] for x in read_metrics(peer.metrics)] == list(range(r + 3))


def test_disk_full_while_checkpointing_keeps_the_node_training(presets: Path, tmp_path: Path) -> None:
    """The state dir on a 6 MiB tmpfs (needs root; skipped otherwise): a tiny-s checkpoint is ~4 MiB, so the
    first fits and every later one fails half way with ENOSPC. The node logs each failure in one line, counts
    it (torch's own error does not say "disk full": the line adds the free space), keeps training, exits 1 with a clear line when its final checkpoint cannot be written either, never
    leaves a partial checkpoint, and the round-1 checkpoint still resumes."""
    from swarm_node.config import load_config
    from swarm_node.grpo.round import GRPONode
    from swarm_node.node.checkpoint import list_checkpoints

    state = tmp_path / "disk"
    if not mount_tmpfs(state, "6m"):
        pytest.skip("cannot mount a tmpfs (not root)")
    try:
        ov = {"rounds": 4, "swarm.enabled": False, "task.prompts_per_round": 4, "task.eval_n": 10,
              "metrics.eval_every": 1000, "checkpoint.every_rounds": 1, "checkpoint.keep": 2}
        cfg = write_peer_config(ROOT / "peers" / "tiny-s.yaml", tmp_path / "node.yaml", ov)
        log = tmp_path / "node.log"  # off the full disk, so the log itself is not what fails
        with open(log, "w") as fh:
            proc = subprocess.Popen(cli("run", "--config", str(cfg), "--state-dir", str(state)), stdout=fh,
                                    stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
        try:
            rc = proc.wait(300)
        finally:
            if proc.poll() is None:
                stop_process(proc, grace_s=5)
        text = log.read_text()
        assert rc == 1, _tail(log)
        assert "Traceback" not in text, text[-3000:]
        failed = [ln for ln in text.splitlines() if "not written" in ln]
        # rounds 2, 3, 4 (every_rounds=1), then the final save at exit tries round 4 once more
        assert [int(re.search(r"checkpoint of round (\d+) not written", ln).group(1)) for ln in failed] == [2, 3, 4, 4]
        assert all("disk full" in ln and "ckpt-00000001 (round 1) is still the one to resume from" in ln
                   for ln in failed), failed
        assert "exiting without a checkpoint of round 4" in text
        rows = read_metrics(state / "metrics.jsonl")
        assert [x["round"] for x in rows] == [0, 1, 2, 3, 4]  # kept training after the first failure
        assert [x.get("checkpoint_failures") for x in rows[1:]] == [0, 0, 1, 2]  # counted (row of the next round)
        assert [p.name for p in state.iterdir() if p.name.startswith(".")] == []  # no partial copy holds space
        assert [c.round for c in list_checkpoints(state)] == [1]
        node = GRPONode(load_config(cfg), state)
        node.resume()
        assert node.last_round == 1
        node.close()
    finally:
        subprocess.run(["umount", "-l", str(state)], capture_output=True, timeout=10)


@pytest.mark.parametrize("disk", ["tmpfs", "file_size_limit"])
def test_a_disk_that_fills_up_and_frees_again_costs_the_node_no_round(presets: Path, tmp_path: Path, disk: str) -> None:
    """A GRPO node whose state dir fills up while it runs, and frees again: a real 32 MiB tmpfs kept full by a
    ballast file (root), or a file-size limit put on the running node (prlimit: EFBIG after a short write,
    any user). While full, every metrics append and checkpoint fails and the node keeps training; once space
    returns it writes the held rows, in order, and its next checkpoint; it stops cleanly with a checkpoint of
    its last round, and metrics.jsonl has every round, each on a whole line. (Before: the first failed
    metrics append raised: traceback, exit 1, no final checkpoint, a torn last line.)"""
    import threading

    from swarm_node.node.checkpoint import latest_checkpoint

    state = tmp_path / "state"
    tmpfs = tmpfs_or_skip(state, "32m", "the file_size_limit case fills the disk without root") \
        if disk == "tmpfs" else None
    ov = {"rounds": None, "swarm.enabled": False, "task.prompts_per_round": 4, "task.eval_n": 10,
          "metrics.eval_every": 1000, "checkpoint.every_rounds": 2, "checkpoint.keep": 1}
    cfg = write_peer_config(ROOT / "peers" / "tiny-s.yaml", tmp_path / "node.yaml", ov)
    log = tmp_path / "node.log"  # off the full disk, and written by this process (a file-size limit is the node's)
    proc = subprocess.Popen(cli("run", "--config", str(cfg), "--state-dir", str(state)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)

    def pump() -> None:
        with open(log, "wb", buffering=0) as fh:
            for line in proc.stdout:
                fh.write(line)

    threading.Thread(target=pump, daemon=True).start()
    metrics = state / "metrics.jsonl"

    def wait_for(what: str, ok, timeout_s: float = 240) -> None:
        end = time.monotonic() + timeout_s
        while not ok():
            assert proc.poll() is None, f"node exited ({proc.returncode}) waiting for {what}\n{_tail(log)}"
            assert time.monotonic() < end, f"no {what} within {timeout_s}s\n{_tail(log)}"
            time.sleep(0.05)

    def logged_round() -> int:  # the last round the node's one line per round names
        return max([int(m) for m in re.findall(r" round (\d+)(?:/\d+)? \| reward", log.read_text())] or [-1])

    limit = FileSizeLimit(proc.pid)
    try:
        try:
            wait_for("checkpoint of round 2", lambda: (latest_checkpoint(state) or SimpleNamespace(round=0)).round >= 2)
            tmpfs.fill() if tmpfs is not None else limit.fill(metrics.stat().st_size + 500)
            full_from = logged_round()
            saved_before = latest_checkpoint(state).round
            wait_for("4 rounds trained on the full disk", lambda: logged_round() >= full_from + 4
                     and "checkpoint of round" in log.read_text() and "metrics.jsonl: rows of rounds" in log.read_text())
            assert _lines_are_whole(metrics)[-1] <= full_from + 1  # nothing got through while full
            tmpfs.free() if tmpfs is not None else limit.free()
            freed_at = logged_round()
            wait_for("rows and a checkpoint after space returned",
                     lambda: read_metrics(metrics, warn=False)[-1]["round"] >= freed_at + 2
                     and latest_checkpoint(state).round > freed_at)
            assert stop_process(proc, grace_s=60) == 0, _tail(log)
        finally:
            if proc.poll() is None:
                stop_process(proc, grace_s=5)
        text = log.read_text()
        assert "Traceback" not in text, text[-3000:]
        last = int(re.search(r"stopping after round (\d+)", text).group(1))
        rows = read_metrics(metrics)
        assert _lines_are_whole(metrics) == list(range(last + 1))  # every round, the held ones too, no torn line
        assert latest_checkpoint(state).round == last and saved_before <= full_from
        failed_saves = [int(r) for r in re.findall(r"checkpoint of round (\d+) not written", text)]
        assert failed_saves and all(full_from <= r <= freed_at for r in failed_saves), failed_saves
        assert rows[-1]["checkpoint_failures"] == len(failed_saves)
        assert text.count("metrics.jsonl is writable again") == 1
    finally:
        if tmpfs is not None:
            tmpfs.close()


def _lines_are_whole(path: Path) -> list[int]:
    """Rounds of metrics.jsonl's rows, after checking that every line is a whole JSON row."""
    import json

    text = path.read_text()
    assert not text or text.endswith("\n"), text[-300:]
    return [json.loads(ln)["round"] for ln in text.splitlines()]


@pytest.mark.parametrize("keep", [1, 2])
def test_sigkill_then_a_torn_checkpoint_resumes_from_the_newest_readable_and_loses_no_later_round(
        presets: Path, tmp_path: Path, keep: int) -> None:
    """Kill and corrupt on real GRPO processes: a node checkpointing every round is SIGKILLed once it has two
    checkpoints, and the newest one's optimizer.pt is cut in half (a power loss). The restart sets it aside in
    one line, resumes from the one before (keep 2) or from the model as loaded (keep 1: nothing readable
    left, and it stops short of the bad round); a second restart continues right after that, so no round
    trained since the first restart was lost (before: with keep 1 every later save pruned the checkpoint it
    had just written, and the second restart began at round 0 again)."""
    import os

    from swarm_node.node.checkpoint import latest_checkpoint, list_checkpoints
    from tests.test_checkpoint import corrupt

    ov = {"rounds": None, "swarm.enabled": False, "task.prompts_per_round": 4, "task.eval_n": 10,
          "metrics.eval_every": 1000, "checkpoint.every_rounds": 1, "checkpoint.keep": keep}
    cfg = write_peer_config(ROOT / "peers" / "tiny-s.yaml", tmp_path / "node.yaml", ov)
    peer = Peer(name="node", config=cfg, state_dir=tmp_path / "node")

    def has_two_rounds() -> bool:  # `keep` checkpoints (the older ones pruned), the newest of round 2 or later
        cks = list_checkpoints(peer.state_dir)
        return len(cks) == keep and cks[-1].round >= 2

    peer.start(None)
    try:
        end = time.monotonic() + 240
        while not has_two_rounds():
            assert peer.running() and time.monotonic() < end, _tail(peer.log_path)
            time.sleep(0.05)
        os.killpg(peer.proc.pid, signal.SIGKILL)
        peer.proc.wait(10)
    finally:
        if peer.running():
            stop_process(peer.proc, grace_s=5)
    bad = latest_checkpoint(peer.state_dir)  # the kill may land in a later save: its .tmp- copy is no checkpoint
    corrupt(bad.path, "torn_optimizer")
    before_bad = [c.round for c in list_checkpoints(peer.state_dir) if c.round < bad.round]
    resumed = before_bad[-1] if before_bad else None  # keep 1: None, unless the kill landed before a prune

    def run_to(rounds: int) -> str:
        return _run_until_done(peer, ["--set", f"rounds={rounds}"])

    # from round 0: stop short of the bad round (a re-save of it would replace it); else train through it
    last = bad.round - 1 if resumed is None else bad.round
    text = run_to(last)
    assert text.count(f"set aside as {bad.path.name}.unreadable") == 1, text[-3000:]
    assert (f"ckpt-{resumed:08d}: continuing at round {resumed + 1}" if resumed is not None
            else "starting at round 0") in text, text[-3000:]
    assert [c.round for c in list_checkpoints(peer.state_dir)] == list(range(last - keep + 1, last + 1))
    text = run_to(last + 1)
    assert f"continuing at round {last + 1}" in text, text[-3000:]
    assert [x["round"] for x in read_metrics(peer.metrics)] == list(range(last + 2))
    assert (peer.state_dir / f"{bad.path.name}.unreadable").is_dir()


# ---- SIGKILL of a peer while we download its blob -----------------------------------------------------

VICTIM = '''
"""A peer whose upload is slow (16 KiB chunks, 0.1 s apart): it announces one 240 kB batch to the swarm (under
the ~250 kB an honest tiny-s node of 4 prompts downloads: grpo/limits.py) and writes the number of body chunks
sent to `marker`, so the test can SIGKILL it mid-transfer."""
import asyncio, os, sys, time
from pathlib import Path
from transformers import AutoTokenizer
from swarm_node.config import SwarmConfig
from swarm_node.models.loading import tokenizer_fingerprint
from swarm_node.swarm import PeerInfo, SwarmPeer
from swarm_node.swarm import transfer
from swarm_node.tasks.arithmetic import ArithmeticTask

model_dir, maddr, swarm_id, marker = sys.argv[1:5]
transfer.CHUNK = 16 * 1024
real_write = transfer._write

sent = [0]

async def slow_write(writer, data, timeout):
    if isinstance(data, memoryview):  # a body chunk
        await asyncio.sleep(0.1)
    await real_write(writer, data, timeout)
    if isinstance(data, memoryview):
        sent[0] += 1
        Path(marker).write_text(str(sent[0]))  # body chunks sent so far

transfer._write = slow_write
tok = AutoTokenizer.from_pretrained(model_dir)
task = ArithmeticTask()
cfg = SwarmConfig(enabled=True, swarm_id=swarm_id, initial_peers=[maddr], host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                  heartbeat_s=1.0, record_ttl_s=8.0)
node = SwarmPeer(cfg, PeerInfo(mode="grpo", model_name="victim", tokenizer_fp=tokenizer_fingerprint(tok),
                               task_id=task.task_id), validate=None).start()
blob = os.urandom(240_000)
while True:
    others = [m.round for m in node.live_peers() if m.peer_id != node.peer_id]
    if others and max(others) >= 1:
        r = max(others) + 1
        node.set_round(r)
        node.publish("batch", r, blob)
        break
    time.sleep(0.3)
while True:
    time.sleep(1)
'''


def test_sigkill_of_a_peer_mid_transfer_costs_the_downloader_no_round(presets: Path, tmp_path: Path) -> None:
    """A peer is SIGKILLed (with its DHT child and p2pd) while our node downloads its 240 kB batch. The
    download fails with a counted reason (swarm:stream_error) within its deadline, a round waits for it at
    most collect_deadline_s (and an async round not at all), nothing crashes, and later rounds go on."""
    import os
    import sys

    from swarm_node.runs.local_swarm import start_bootstrap

    swarm_id = "mp-kill-transfer"
    boot = start_bootstrap(tmp_path / "bootstrap", swarm_id)
    ov = {"rounds": None, "task.prompts_per_round": 4, "task.eval_n": 20, "metrics.eval_every": 1000,
          "checkpoint.every_rounds": 1000, "swarm.swarm_id": swarm_id, "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
          "swarm.heartbeat_s": 1.0, "swarm.record_ttl_s": 8.0, "swarm.collect_deadline_s": 8.0,
          "swarm.bootstrap_timeout_s": 20.0}
    cfg = write_peer_config(ROOT / "peers" / "tiny-s.yaml", tmp_path / "honest.yaml", ov)
    honest = Peer(name="honest", config=cfg, state_dir=tmp_path / "honest")
    (tmp_path / "victim.py").write_text(VICTIM)
    marker = tmp_path / "victim.sending"
    victim = None
    try:
        honest.start(boot.maddrs)
        victim = subprocess.Popen([sys.executable, str(tmp_path / "victim.py"), str(presets / "tiny-s"), boot.maddrs[0],
                                   swarm_id, str(marker)], stdout=open(tmp_path / "victim.log", "w"),
                                  stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
        end = time.monotonic() + 180
        while not (marker.exists() and int(marker.read_text() or 0) >= 5):  # 80 of 240 kB sent
            assert time.monotonic() < end, (tmp_path / "victim.log").read_text()[-3000:] + _tail(honest.log_path)
            assert victim.poll() is None and honest.running(), _tail(honest.log_path)
            time.sleep(0.05)
        os.killpg(victim.pid, signal.SIGKILL)  # the peer, its DHT child and its p2pd: gone mid-upload
        killed_at = time.time()
        assert victim.wait(10) == -signal.SIGKILL
        rows_before = len(read_metrics(honest.metrics))
        # later rounds go on: wait for 4 more rows, and for the failed download to be counted
        end = time.monotonic() + 120
        while True:
            rows = read_metrics(honest.metrics)
            failed = sum(r.get("rejected", {}).get("swarm:stream_error", 0) for r in rows)
            if len(rows) >= rows_before + 4 and failed:
                break
            assert time.monotonic() < end, (rows[-3:], _tail(honest.log_path))
            assert honest.running(), _tail(honest.log_path)
            time.sleep(0.3)
        assert stop_process(honest.proc, grace_s=60) == 0, _tail(honest.log_path)
    finally:
        if victim is not None and victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
        if honest.running():
            stop_process(honest.proc, grace_s=5)
        boot.stop()
    rows = read_metrics(honest.metrics)
    text = honest.log_path.read_text()
    assert "Traceback" not in text, text[-3000:]
    after = [r for r in rows[1:] if r["time"] > killed_at]
    assert len(after) >= 3
    # Stated bound: a round waits at most collect_deadline_s (8 s) for a dying transfer, and only if it is a
    # waiting round (lockstep, or the first exchange after joining, which waits once for live peers' first
    # batches: when the kill lands in that wait, the dead peer still counts as live until its record
    # expires); an async round after that waits for nothing (collect_s ~0).
    waits = [r["collect_s"] for r in after]
    assert all(w <= 8.0 + 2.0 for w in waits) and all(w < 1.0 for w in waits[1:]), waits
    # part of the blob had arrived, none of it was trained on, and the failure was counted by its reason
    assert sum(r["bytes_in"] for r in rows[1:]) > 0
    assert all(not any(k.endswith(":victim") for k in r["external_groups_by_peer"]) for r in rows[1:])
    assert sum(r["rejected"].get("swarm:stream_error", 0) for r in rows[1:]) >= 1, [r["rejected"] for r in rows]


@pytest.mark.timeout(300)
def test_dpo_neighbours_get_every_next_round_of_a_node_whose_dht_child_is_killed() -> None:
    """4 SwarmPeers in DPO rounds on a ring (tooling/dpo_ring.py: the DPO demo's swarm settings, fast
    local steps); node 0's DHT child is SIGKILLed 4 times. Before, its failed member reads answered
    "nobody", so it ran rounds alone, ahead of its neighbours, and the round they asked it for next was no
    longer kept (4 of 10 kills lost a round at both neighbours; benchmarks/dht_recovery.py --exchange dpo).
    Now both neighbours hold node 0's next round after every kill."""
    from tooling.dpo_ring import kill_and_watch

    rows = kill_and_watch(4, 4, seed=1, payload=700_000, step_s=0.05)
    print("\n" + "\n".join(str(r) for r in rows))
    assert len(rows) == 8
    assert all(r["got"] for r in rows), [r for r in rows if not r["got"]]
