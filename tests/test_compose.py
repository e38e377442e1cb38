"""compose.yaml, the Dockerfile and the container healthcheck.

Without a Docker engine: compose.yaml must validate against the Compose specification's JSON schema and
against the schema of Debian's docker-compose 1.29.2 (both vendored in tests/data, see
compose-spec.SOURCES.md), its commands must parse with the real CLI and name peer configs that load, and
its wiring (addresses file, volumes, swarm ids, identities) must be consistent. The healthcheck script
runs for real against a bootstrap peer. With an engine reachable, the slow test runs
scripts/compose-smoke.sh, which builds the image and trains the compose swarm.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
import yaml

from swarm_node.cli import build_parser
from swarm_node.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
SCHEMAS = ["compose-spec.json", "compose-spec-docker-compose-1.29.2.json"]
GRPO = ["tiny-s", "tiny-m", "tiny-s-lora"]
DPO = ["dpo-0", "dpo-1", "dpo-2", "dpo-3"]
_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """What compose does before validating: ${VAR:-default} -> the variable, or else its default."""
    env = env or {}
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(2) or ""), text)


def load_compose(env: dict[str, str] | None = None) -> dict:
    return yaml.safe_load(interpolate((ROOT / "compose.yaml").read_text(), env))


@functools.cache
def _parser():
    return build_parser()


def parse(cmd: list[str]):
    assert cmd[0] == "swarm-node", cmd
    return _parser().parse_args(cmd[1:])


def overrides(args) -> dict[str, str]:
    return dict(o.split("=", 1) for o in args.overrides)


def repo_config(args):
    local = ROOT / str(args.config).removeprefix("/app/")
    assert local.is_file(), f"{args.config} does not exist in the repo"
    return load_config(local, list(args.overrides))


def mounts(service: dict) -> dict[str, tuple[str, bool]]:
    """container path -> (volume name, read-only)"""
    out = {}
    for v in service.get("volumes", []):
        parts = v.split(":")
        out[parts[1]] = (parts[0], len(parts) > 2 and "ro" in parts[2].split(","))
    return out


# ---- the file against the Compose schemas ------------------------------------------------------------


@pytest.mark.parametrize("schema_file", SCHEMAS)
def test_compose_file_validates_against_the_schema(schema_file):
    schema = json.loads((DATA / schema_file).read_text())
    compose = load_compose()
    jsonschema.validate(compose, schema)
    # also with every knob set, the way scripts/compose-smoke.sh runs it
    knobs = {"SWARM_NODE_ROUNDS": "6", "SWARM_NODE_CPUS": "0.5", "SWARM_NODE_MEMORY": "2g",
             "SWARM_NODE_BOOTSTRAP_PORT": "31999", "SWARM_NODE_IMAGE": "swarm-node:smoke"}
    jsonschema.validate(load_compose(knobs), schema)


def test_schema_check_catches_what_compose_1_29_rejects():
    """The reason compose.yaml has no top-level `name:`: docker-compose 1.29 refuses the file."""
    old = json.loads((DATA / "compose-spec-docker-compose-1.29.2.json").read_text())
    new = json.loads((DATA / "compose-spec.json").read_text())
    compose = {**load_compose(), "name": "swarm-node"}
    jsonschema.validate(compose, new)
    with pytest.raises(jsonschema.ValidationError, match="name"):
        jsonschema.validate(compose, old)


# ---- topology and wiring -----------------------------------------------------------------------------


def test_compose_topology_and_commands():
    services = load_compose()["services"]
    boot = parse(services["bootstrap"]["command"])
    assert boot.command == "bootstrap" and boot.maddrs_file and boot.identity
    # a fixed identity, on a volume only the bootstrap mounts; a name-based address that survives a new IP
    key_dir = str(Path(boot.identity).parent)
    key_volume = mounts(services["bootstrap"])[key_dir][0]
    assert all(key_volume not in [v for v, _ in mounts(s).values()] for n, s in services.items() if n != "bootstrap")
    assert boot.announce_maddrs == ["/dns4/bootstrap/tcp/31337"]
    addr_dir = str(Path(boot.maddrs_file).parent)
    addr_volume, ro = mounts(services["bootstrap"])[addr_dir]
    assert not ro
    state_volumes = []
    for name in GRPO + DPO + ["tiny-m-gpu"]:
        s = services[name]
        args = parse(s["command"])
        assert args.command == "run"
        assert str(args.initial_peers_file) == boot.maddrs_file, f"{name} must read the file the bootstrap writes"
        m = mounts(s)
        assert m[addr_dir] == (addr_volume, True), f"{name}: the addresses volume, read-only"
        volume, ro = m[str(args.state_dir)]
        assert not ro and volume.startswith("state-")
        state_volumes.append(volume)
        cfg = repo_config(args)
        assert cfg.swarm.enabled or args.initial_peers_file
        env = s["environment"]
        assert env["SWARM_NODE_SWARM"] == cfg.swarm.swarm_id, f"{name}: healthcheck asks the wrong swarm"
        assert env["SWARM_NODE_IDENTITY"] == overrides(args)["swarm.identity_path"]
        assert Path(env["SWARM_NODE_IDENTITY"]).parent == Path(args.state_dir), "identity lives on the state volume"
        assert env["SWARM_NODE_BOOTSTRAP_FILE"] == boot.maddrs_file
        assert s["restart"].startswith("on-failure"), "a node that finished its rounds stays down"
        assert s["healthcheck"]["test"] == ["CMD", "swarm-node-healthcheck"]
        limits = s["deploy"]["resources"]["limits"]
        assert float(limits["cpus"]) > 0 and limits["memory"]
    assert len(set(state_volumes)) == len(state_volumes), "each node has its own state volume"
    assert set(state_volumes) | {key_volume, addr_volume} <= set(load_compose()["volumes"])


def test_grpo_peers_are_heterogeneous_and_default_on():
    services = load_compose()["services"]
    default_on = [n for n, s in services.items() if not s.get("profiles")]
    assert sorted(default_on) == sorted(["bootstrap", *GRPO])
    cfgs = [repo_config(parse(services[n]["command"])) for n in GRPO]
    assert all(c.mode == "grpo" and c.swarm.swarm_id == "demo" for c in cfgs)
    assert len({c.model.path for c in cfgs}) >= 2 and any(c.model.lora.enabled for c in cfgs)
    assert len({c.model.name or c.model.path for c in cfgs}) == 3, "distinct names, so peers tell each other apart"
    knobs = load_compose({"SWARM_NODE_ROUNDS": "6", "SWARM_NODE_EVAL_N": "50"})["services"]
    assert all(repo_config(parse(knobs[n]["command"])).rounds == 6 for n in GRPO)
    assert all(repo_config(parse(knobs[n]["command"])).task.eval_n == 50 for n in GRPO)
    assert repo_config(parse(load_compose({"SWARM_NODE_ROUNDS": "null"})["services"]["tiny-s"]["command"])).rounds is None


def test_dpo_profile_is_a_ring_of_four():
    services = load_compose()["services"]
    assert sorted(n for n, s in services.items() if "dpo" in s.get("profiles", [])) == DPO
    cfgs = [repo_config(parse(services[n]["command"])) for n in DPO]
    assert all(c.mode == "dpo" and c.dpo.averaging == "gossip" and c.dpo.topology == "ring" for c in cfgs)
    assert sorted(c.dpo.user for c in cfgs) == [0, 1, 2, 3], "each node holds another user's preferences"
    assert all(c.dpo.min_peers == 4 for c in cfgs) and len({c.swarm.swarm_id for c in cfgs}) == 1


def test_gpu_profile_reserves_a_gpu_and_builds_the_cuda_image():
    s = load_compose()["services"]["tiny-m-gpu"]
    assert s["profiles"] == ["gpu"]
    devices = s["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert s["build"]["args"]["TORCH_VARIANT"] == "cuda"
    assert s["image"] != load_compose()["services"]["tiny-m"]["image"], "the CUDA image must not replace the CPU one"
    assert overrides(parse(s["command"]))["model.device"] == "cuda"


# ---- Dockerfile and build context --------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_layers_user_health_and_build_args():
    ins = _instructions()
    words = [w for w, _ in ins]
    assert ins[0] == ("ARG", "BASE_IMAGE=python:3.11-slim") and ins[1] == ("FROM", "${BASE_IMAGE}")
    args = {rest.split("=")[0] for w, rest in ins if w == "ARG"}
    assert {"TORCH_VARIANT", "TORCH_INDEX_URL", "TORCH_WHEEL_DIR"} <= args
    runs = [i for i, (w, rest) in enumerate(ins) if w == "RUN"]
    torch_run = next(i for i in runs if "torch==" in ins[i][1])
    source_copy = next(i for i, (w, rest) in enumerate(ins) if w == "COPY" and rest.startswith("swarm_node"))
    presets_run = next(i for i in runs if "make-model" in ins[i][1])
    assert torch_run < source_copy < presets_run, "torch before the source; presets built from the source"
    early = [ins[i][1].split()[:-1] for i in range(torch_run) if ins[i][0] == "COPY"]
    assert all(src[0] == "scripts/container-healthcheck.sh" and src[1].endswith("}*") for src in early), \
        "only the healthcheck script and the optional wheel / CA files may invalidate the torch layer"
    user = [rest for w, rest in ins if w == "USER"]
    assert user and user[-1] not in ("root", "0") and words.index("USER") > presets_run
    assert any(w == "VOLUME" and "/state" in rest for w, rest in ins)
    assert any(w == "HEALTHCHECK" and "swarm-node-healthcheck" in rest for w, rest in ins)
    assert "swarm-node status" in (ROOT / "scripts/container-healthcheck.sh").read_text()


def _ignored(path: str, rules: list[str]) -> bool:
    """.dockerignore semantics for the simple patterns it uses: the last matching rule wins."""
    import fnmatch

    ignored = False
    for rule in rules:
        neg = rule.startswith("!")
        pat = rule[1:] if neg else rule
        pat = pat.rstrip("/")
        if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/") or fnmatch.fnmatch(path, pat.replace("**/", "")):
            ignored = not neg
    return ignored


def test_dockerignore_keeps_exactly_what_the_dockerfile_copies():
    rules = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    defaults = dict(rest.split("=", 1) for w, rest in _instructions() if w == "ARG" and "=" in rest)
    optional = {defaults["TORCH_WHEEL_DIR"], defaults["PIP_CA_BUNDLE"]}  # COPY'd as ${ARG}*: may be absent
    sources = []
    for w, rest in _instructions():
        if w == "COPY":
            sources += [_VAR.sub(lambda m: defaults[m.group(1)], s).removesuffix("*") for s in rest.split()[:-1]]
    assert optional <= set(sources)
    for src in sources:
        assert (ROOT / src).exists() or src in optional, src
        assert not _ignored(src, rules), f"{src} is copied by the Dockerfile but excluded by .dockerignore"
        assert not _ignored(src + "/x.py", rules) or not (ROOT / src).is_dir(), src
    for junk in [".git", ".venv", "runs", "demo-out", ".cache/swarm-node", "tests/test_compose.py",
                 "swarm_node/__pycache__/cli.cpython-311.pyc", ".presets"]:
        assert _ignored(junk, rules), f"{junk} would be sent to the build"


# ---- the healthcheck script, against a real bootstrap ------------------------------------------------


def _shims(tmp_path: Path) -> dict[str, str]:
    """`swarm-node` and `python` on PATH as in the image, running this checkout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, target in {"swarm-node": f'"{sys.executable}" -m swarm_node.cli "$@"',
                         "python": f'"{sys.executable}" "$@"'}.items():
        p = bin_dir / name
        p.write_text(f"#!/bin/sh\nexec {target}\n")
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}


def _health(env: dict, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(ROOT / "scripts/container-healthcheck.sh")], env={**env, **extra},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_healthcheck_reports_bootstrap_and_membership(tmp_path):
    from hivemind.p2p import P2P

    from swarm_node.config import SwarmConfig
    from swarm_node.swarm import PeerInfo, SwarmNode

    env = _shims(tmp_path)
    addrs = tmp_path / "swarm" / "bootstrap.maddrs"
    assert _health(env).returncode == 0, "no bootstrap file configured: nothing to check"
    missing = _health(env, SWARM_NODE_BOOTSTRAP_FILE=str(addrs))
    assert missing.returncode == 1 and "no bootstrap multiaddrs" in missing.stdout
    boot = subprocess.Popen(
        [sys.executable, "-m", "swarm_node.cli", "bootstrap", "--host-maddrs", "/ip4/127.0.0.1/tcp/0",
         "--identity", str(tmp_path / "boot.key"), "--swarm", "hc", "--maddrs-file", str(addrs)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    node = None
    try:
        end = time.monotonic() + 60
        while not addrs.is_file() and time.monotonic() < end:
            time.sleep(0.5)
        base = {"SWARM_NODE_BOOTSTRAP_FILE": str(addrs), "SWARM_NODE_SWARM": "hc"}
        up = _health(env, **base)
        assert up.returncode == 0 and "bootstrap answers" in up.stdout, up.stdout + up.stderr
        stranger = tmp_path / "stranger.key"
        P2P.generate_identity(str(stranger))
        absent = _health(env, **base, SWARM_NODE_IDENTITY=str(stranger))
        assert absent.returncode == 1 and "not among" in absent.stdout, absent.stdout + absent.stderr
        ident = tmp_path / "node.key"
        cfg = SwarmConfig(enabled=True, swarm_id="hc", initial_peers=addrs.read_text().split(),
                          host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=str(ident), heartbeat_s=1.0)
        node = SwarmNode(cfg, PeerInfo(mode="grpo", model_name="tiny-s", tokenizer_fp="t", task_id="x")).start()
        listed = _health(env, **base, SWARM_NODE_IDENTITY=str(ident))
        assert listed.returncode == 0 and node.peer_id in listed.stdout, listed.stdout + listed.stderr
    finally:
        if node is not None:
            node.close()
        boot.terminate()
        boot.wait(30)
    down = _health(env, SWARM_NODE_BOOTSTRAP_FILE=str(addrs), SWARM_NODE_SWARM="hc")
    assert down.returncode != 0, "a bootstrap that is gone is unhealthy"


# ---- the real thing: scripts/compose-smoke.sh --------------------------------------------------------


def _docker_engine() -> str | None:
    """None when an engine answers; else why not (checked in seconds, never starts one)."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    try:
        res = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                             text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "docker version did not answer within 15 s"
    if res.returncode != 0 or not res.stdout.strip():
        return "no Docker engine reachable: " + (res.stderr.strip().splitlines() or ["(no message)"])[-1]
    return None


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_compose_smoke_script_trains_the_swarm():
    why = _docker_engine()
    if why:
        pytest.skip(why + " (scripts/compose-smoke.sh needs one; it starts dockerd itself when run as root)")
    res = subprocess.run(["bash", str(ROOT / "scripts/compose-smoke.sh")], cwd=ROOT, capture_output=True,
                         text=True, timeout=3500)
    print(res.stdout[-6000:])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert re.search(r"phase grpo done", res.stdout) and re.search(r"phase dpo done", res.stdout)
    for peer in GRPO:
        assert re.search(rf"{re.escape(peer)}\s+rounds \d+: external groups used [1-9]", res.stdout), peer
