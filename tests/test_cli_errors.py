"""Every mistake a user can make at the command line ends in one line naming the problem and the fix, exit 2.

Most cases run `main()` in-process with `model.path` pointing at a directory that is not a model: the
expected message proves the check ran before the model would have loaded. Read-only paths are real: a
read-only tmpfs mount (root passes every permission check, so chmod proves nothing here), or a path that
runs through a regular file.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarm_node.cli import main

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def not_a_model(tmp_path: Path) -> Path:
    d = tmp_path / "not-a-model"
    d.mkdir()
    (d / "notes.txt").write_text("hello")
    return d


@pytest.fixture
def read_only_dir(tmp_path: Path):
    """A really read-only directory (a read-only tmpfs mount); skipped where mounting is not allowed."""
    d = tmp_path / "ro"
    d.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {res.stderr.decode().strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], capture_output=True)


def one_line_error(capsys, rc: int, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


def run_cmd(state_dir: Path, model: Path, *extra: str) -> int:
    return main(["run", "--state-dir", str(state_dir), "--set", f"model.path={model}", "--set", "rounds=1", *extra])


# ---- state dir -------------------------------------------------------------------------------------


def test_state_dir_through_a_file(tmp_path, capsys, not_a_model):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    rc = run_cmd(blocker / "state", not_a_model)
    one_line_error(capsys, rc, "--state-dir", "runs through", "is a file", "pick another --state-dir")


def test_state_dir_on_read_only_file_system(read_only_dir, capsys, not_a_model):
    rc = run_cmd(read_only_dir / "state", not_a_model)
    one_line_error(capsys, rc, "--state-dir", "read-only file system", "pick a writable --state-dir")


def test_existing_read_only_state_dir(read_only_dir, capsys, not_a_model):
    rc = run_cmd(read_only_dir, not_a_model)  # exists already: mkdir succeeds, only a write fails
    one_line_error(capsys, rc, "--state-dir", "read-only file system")


def test_demo_out_on_read_only_path(read_only_dir, capsys):
    rc = main(["demo", "--out", str(read_only_dir / "demo"), "--rounds", "1"])
    one_line_error(capsys, rc, "--out", "read-only file system")


def test_demo_out_through_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    rc = main(["demo", "--out", str(tmp_path / "f" / "demo"), "--rounds", "1"])
    one_line_error(capsys, rc, "--out", "runs through")


def test_make_model_out_on_read_only_path(read_only_dir, capsys):
    t0 = time.monotonic()
    rc = main(["make-model", "--preset", "tiny-s", "--out", str(read_only_dir / "m")])
    one_line_error(capsys, rc, "--out", "read-only file system")
    assert time.monotonic() - t0 < 10  # refused before building (a build takes 20-40 s)


def test_make_model_out_through_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    rc = main(["make-model", "--preset", "tiny-s", "--out", str(tmp_path / "f" / "m")])
    one_line_error(capsys, rc, "--out", "runs through")


# ---- ports and addresses ---------------------------------------------------------------------------


def test_prometheus_port_in_use(tmp_path, capsys, not_a_model):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc = run_cmd(tmp_path / "s", not_a_model, "--metrics-port", str(port))
    one_line_error(capsys, rc, "metrics.prometheus_port", f"port {port}", "already in use")


def test_bootstrap_address_without_peer_id_is_refused_at_once(tmp_path, capsys, not_a_model):
    t0 = time.monotonic()
    rc = run_cmd(tmp_path / "s", not_a_model, "--initial-peers", "/ip4/127.0.0.1/tcp/31337")
    one_line_error(capsys, rc, "/ip4/127.0.0.1/tcp/31337", "has no /p2p/<peer id>", "expected /ip4/HOST/tcp/PORT/p2p/")
    rc = main(["status", "--initial-peers", "/ip4/127.0.0.1/tcp/31337", "--retries", "0", "--timeout", "5"])
    one_line_error(capsys, rc, "has no /p2p/<peer id>")
    assert time.monotonic() - t0 < 5  # no join attempts at all


def test_status_needs_an_address_and_says_how_long_it_waited_for_the_file(tmp_path, capsys):
    one_line_error(capsys, main(["status"]), "--initial-peers", "--initial-peers-file")
    t0 = time.monotonic()
    rc = main(["status", "--initial-peers-file", str(tmp_path / "bootstrap.maddrs"), "--wait-s", "1"])
    one_line_error(capsys, rc, "no multiaddrs in", "bootstrap.maddrs", "after 1s")
    assert time.monotonic() - t0 < 5
    one_line_error(capsys, main(["status", "--initial-peers-file", "f", "--wait-for", "-1"]), "--wait-for")


# ---- models ----------------------------------------------------------------------------------------


def test_directory_that_is_not_a_model(tmp_path, capsys, not_a_model):
    rc = main(["eval", "--model", str(not_a_model), "--n", "1"])
    err = one_line_error(capsys, rc, "is not a model directory", "config.json", "weights")
    assert "sentencepiece" not in err.lower()
    (not_a_model / "config.json").write_text('{"model_type": "llama"}')  # config but no weights
    rc = main(["eval", "--model", str(not_a_model), "--n", "1"])
    err = one_line_error(capsys, rc, "no weights")
    assert "config.json" not in err.split("no weights")[0].split("has no")[-1]


# ---- --help and progress bars ----------------------------------------------------------------------


HELP_SCRIPT = """
import sys
from swarm_node.cli import main
for command in ([], ["run"], ["make-model"], ["eval"], ["demo"], ["status"], ["report"], ["bootstrap"], ["plan"]):
    try:
        main([*command, "--help"])
    except SystemExit:
        pass
print("TORCH" if "torch" in sys.modules else "NO-TORCH")
"""


@pytest.mark.slow  # a fresh interpreter (this one has torch loaded already)
def test_help_does_not_import_torch():
    out = subprocess.run([sys.executable, "-c", HELP_SCRIPT], capture_output=True, text=True, timeout=120).stdout
    assert "usage: swarm-node bootstrap" in out and out.strip().endswith("NO-TORCH"), out[-300:]


def test_preset_names_match_the_factory():
    from swarm_node.commands.make_model import PRESET_NAMES, STANDIN_NAMES
    from swarm_node.models.presets import preset_names
    from swarm_node.models.standins import standin_names

    assert sorted(PRESET_NAMES) == preset_names()
    assert sorted(STANDIN_NAMES) == standin_names()


@pytest.mark.slow
def test_no_loading_weights_bar_in_commands(presets_dir):
    res = subprocess.run([sys.executable, "-m", "swarm_node.cli", "eval", "--model", "tiny-s", "--n", "4"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "120"})
    assert res.returncode == 0, res.stderr
    assert "Loading weights" not in res.stderr and "Loading weights" not in res.stdout, res.stderr


# ---- a real bootstrap peer ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    """One bootstrap peer on a fixed port with an identity file, shared by the tests below."""
    from swarm_node.runs.local_swarm import child_env, cli, stop_process

    d = tmp_path_factory.mktemp("boot")
    port = free_port()
    ident = d / "boot.key"
    maddrs_file = d / "maddrs.txt"
    proc = subprocess.Popen(cli("bootstrap", "--host-maddrs", f"/ip4/127.0.0.1/tcp/{port}", "--identity", str(ident),
                                "--maddrs-file", str(maddrs_file)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(), start_new_session=True)
    end = time.monotonic() + 60
    while not maddrs_file.exists() and time.monotonic() < end and proc.poll() is None:
        time.sleep(0.2)
    assert maddrs_file.exists(), proc.stderr.read().decode() if proc.poll() is not None else "no maddrs"
    try:
        yield {"port": port, "identity": ident, "maddrs": maddrs_file.read_text().split()}
    finally:
        stop_process(proc)


def _second_bootstrap(*args: str) -> subprocess.CompletedProcess:
    from swarm_node.runs.local_swarm import child_env, cli

    try:
        return subprocess.run(cli("bootstrap", *args), capture_output=True, text=True, timeout=30, env=child_env())
    except subprocess.TimeoutExpired:
        pytest.fail("the second bootstrap peer started and served instead of being refused")


@pytest.mark.slow
def test_second_bootstrap_on_the_same_port_is_refused(bootstrap):
    res = _second_bootstrap("--host-maddrs", f"/ip4/127.0.0.1/tcp/{bootstrap['port']}")
    assert res.returncode == 2, res.stderr
    assert f"port {bootstrap['port']}" in res.stderr and "already in use" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.slow
def test_second_bootstrap_with_the_same_identity_is_refused(bootstrap):
    res = _second_bootstrap("--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--identity", str(bootstrap["identity"]))
    assert res.returncode == 2, res.stderr
    assert "already in use by a running peer" in res.stderr and str(bootstrap["identity"]) in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.slow
def test_node_listening_on_the_bootstrap_port_is_refused(bootstrap, tmp_path, capsys, not_a_model):
    rc = run_cmd(tmp_path / "s", not_a_model, "--initial-peers", *bootstrap["maddrs"],
                 "--set", f"swarm.host_maddrs=[/ip4/127.0.0.1/tcp/{bootstrap['port']}]")
    one_line_error(capsys, rc, "swarm.host_maddrs", f"port {bootstrap['port']}", "already in use")


@pytest.mark.slow
def test_status_without_swarm_finds_the_demo_swarm_and_says_where_it_looked(bootstrap, capsys):
    from swarm_node.config import SwarmConfig
    from swarm_node.swarm import PeerInfo, SwarmPeer

    cfg = SwarmConfig(enabled=True, swarm_id="demo", initial_peers=bootstrap["maddrs"],
                      host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    with SwarmPeer(cfg, PeerInfo(mode="grpo", model_name="probe-model", tokenizer_fp="fp", task_id="t"),
                   validate=None) as node:
        end = time.monotonic() + 30
        out = ""
        while time.monotonic() < end:
            assert main(["status", "--initial-peers", *bootstrap["maddrs"]]) == 0
            out = capsys.readouterr().out
            if node.peer_id in out:
                break
            time.sleep(1.0)
        assert "swarm 'demo': 1 live peer(s)" in out and node.peer_id in out, out
        assert "looked at swarms 'default' and 'demo'" in out, out
        assert main(["status", "--initial-peers", *bootstrap["maddrs"], "--swarm", "other"]) == 0
        out = capsys.readouterr().out
        assert "swarm 'other': 0 live peer(s)" in out and node.peer_id not in out, out
