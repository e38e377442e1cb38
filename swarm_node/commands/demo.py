"""`swarm-node demo`: the embedded default. A local swarm of heterogeneous tiny peers, with a report.

Builds (or reuses) the tiny presets, starts a bootstrap peer and one process per peer on 127.0.0.1,
shows a live table and serves a live page (`swarm-node dashboard`'s) while it runs, then writes
report.json, report.md and PNG plots.

By default the peers specialise (each samples one part of the arithmetic task, all are scored on the
three) and each is first trained alone on its own part for the same rounds: the baseline, so that the live
table and the report show each peer's gain over alone with its SE, which is what a swarm is for
(docs/results/learning.md, "Where the swarm pays"). `--no-specialise` is the demo as it was before: every peer on
its config's full task, swarm arm only (`--compare-alone` adds the alone arm there too).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from swarm_node.errors import UserFacingError

NAME = "demo"
HELP = "run a local swarm of GRPO peers and report what it gave each (default: tiny specialists against alone)"



def peers_dir() -> Path:
    """The example peer configs: the checkout's peers/ (dev, editable install) or the packaged copy (wheel)."""
    here = Path(__file__).resolve()
    repo = here.parents[2] / "peers"
    return repo if repo.is_dir() else here.parents[1] / "peers"  # wheels ship peers/ as swarm_node/peers


DEFAULT_PEERS = ["tiny-s", "tiny-m", "tiny-s-lora"]
DEFAULT_ROUNDS = 60
DASHBOARD_PORT = 8470  # `swarm-node dashboard`'s default too
SPECIALTIES = ("add", "sub", "signed")  # --specialise: the arithmetic universe's parts, one per peer in order
SPECIALISED_EVAL_N = 1200  # --specialise scores on 400 problems of each part (the specialties benchmark's set)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="output directory (default: ./demo-out)")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"rounds per peer (default: the largest `rounds` the peer configs set, else {DEFAULT_ROUNDS}; "
                        "peers/smollm2-*.yaml set theirs)")
    p.add_argument("--peers", nargs="+", default=DEFAULT_PEERS,
                   help="peer configs: names of peers/*.yaml or paths (default: tiny-s tiny-m tiny-s-lora)")
    p.add_argument("--task", default=None, choices=["arithmetic", "gsm8k"],
                   help="task for every peer (default: each peer config's own, e.g. reasoning_gym for peers/rg-*.yaml)")
    p.add_argument("--data-path", default=None, help="gsm8k: JSONL/parquet file")
    p.add_argument("--variant", default=None, help="override training.variant for every peer (e.g. naive, ftis)")
    p.add_argument("--specialise", action=argparse.BooleanOptionalAction, default=None,
                   help="each peer samples one part of the arithmetic task (add, sub, signed, in peer order) and "
                        "is scored on all three: what peers with different skills gain (docs/results/learning.md, "
                        "'Where the swarm pays'). Default: on when every peer runs arithmetic on a tiny preset "
                        "(the default peers); --no-specialise keeps each peer on its config's full task, swarm "
                        "only (the demo before 2026-12-07)")
    p.add_argument("--compare-alone", action=argparse.BooleanOptionalAction, default=None,
                   help="first train each peer alone (no swarm) for the same rounds: the baseline of the 'gain "
                        "over alone' column in the live table and the report, and the dashed curves of the plots; "
                        "with --specialise, alone means alone on its own part. Default: on when the peers "
                        "specialise")
    p.add_argument("--eval-n", type=int, default=None,
                   help=f"held-out problems each eval scores (default: {SPECIALISED_EVAL_N} when the peers "
                        "specialise, else each peer config's task.eval_n)")
    p.add_argument("--eval-every", type=int, default=None,
                   help="evaluate every k rounds (default: each peer config's metrics.eval_every)")
    p.add_argument("--seed", type=int, default=None,
                   help="run seed S: each peer's seed becomes its config's seed + 1000 * S (new prompts and samples; "
                        "the held-out problems stay the same, so seeds compare paired); default: the configs' seeds")
    p.add_argument("--dashboard-port", type=int, default=DASHBOARD_PORT,
                   help=f"port of the live page on 127.0.0.1 (default: {DASHBOARD_PORT}, or any free one if taken; "
                   "0: any free port; -1: no page)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _resolve_peer(spec: str) -> Path:
    path = Path(spec)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    cand = peers_dir() / f"{spec}.yaml"
    if cand.is_file():
        return cand
    known = sorted(p.stem for p in peers_dir().glob("*.yaml") if not p.stem.startswith("dpo"))
    raise UserFacingError(f"unknown peer {spec!r}: give a YAML path or one of {known}")


def _peer_names(templates: list[Path]) -> list[str]:
    """One name (and state dir) per peer: `--peers tiny-s tiny-s` runs two peers, tiny-s and tiny-s-2."""
    names: list[str] = []
    for t in templates:
        name, i = t.stem, 2
        while name in names:
            name, i = f"{t.stem}-{i}", i + 1
        names.append(name)
    return names


def default_rounds(templates: list[Path]) -> int:
    """The largest `rounds` the peer configs set (a real model's config sizes its own demo), else 60."""
    import yaml

    found = [(yaml.safe_load(t.read_text()) or {}).get("rounds") for t in templates]
    return max((int(r) for r in found if r), default=DEFAULT_ROUNDS)


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def _build_presets(templates: list[Path]) -> None:
    """Build the presets the peers load that are not cached yet, side by side on a machine with the cores for
    it: a build trains on one torch thread (models/presets.py), so a fresh clone's tiny-s and tiny-m take the
    longer build's time on 2 cores, not the sum (~85 s, not ~140 s, on the idle 2-core box)."""
    import yaml

    from swarm_node.models.factory import ensure_preset, preset_is_built
    from swarm_node.models.presets import preset_names

    needed = []
    for t in templates:
        path = (yaml.safe_load(t.read_text()) or {}).get("model", {}).get("path", "tiny-s")
        if path in preset_names() and path not in needed:
            needed.append(path)
    missing = [name for name in needed if not preset_is_built(name)]
    workers = min(len(missing), os.cpu_count() or 1)
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            for build in [pool.submit(ensure_preset, name, progress=_say) for name in missing]:
                build.result()
    for name in needed:  # cached now (or built here, one at a time, on one core)
        ensure_preset(name, progress=_say)


def peer_configs(arm: str, args: argparse.Namespace, templates: list[Path], out: Path) -> list:
    """One config per peer for an arm (swarm or alone), written under out/configs/<arm>/."""
    import yaml

    from swarm_node.runs.local_swarm import Peer, write_peer_config

    swarm = arm == "swarm"
    # loopback only: a local demo should not open ports on every interface of the machine
    overrides = {"rounds": args.rounds, **({"metrics.eval_every": args.eval_every} if args.eval_every else {}),
                 **({"task.eval_n": args.eval_n} if getattr(args, "eval_n", None) else {}),
                 **({"task.name": args.task} if args.task else {}), "swarm.enabled": swarm, "swarm.swarm_id": "demo", "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"]}
    if args.data_path:
        overrides["task.data_path"] = str(Path(args.data_path).resolve())
    if args.variant:
        overrides["training.variant"] = args.variant
    # the swarm's peers start their rounds together, however long each takes to load its model (both arms'
    # configs alike: alone, the swarm settings are unused)
    overrides.update({"swarm.wait_for_peers": len(templates) - 1, "swarm.join_wait_s": 180.0})
    peers = []
    for i, (name, t) in enumerate(zip(_peer_names(templates), templates, strict=True)):
        seeded = dict(overrides)
        if getattr(args, "specialise", False):
            seeded["task.mix"] = {SPECIALTIES[i % len(SPECIALTIES)]: 1}
            seeded["task.eval_split"] = "union"  # held-out problems of all three parts, in turns
        if getattr(args, "seed", None) is not None:
            seeded["seed"] = int((yaml.safe_load(t.read_text()) or {}).get("seed", 0)) + 1000 * args.seed
        cfg = write_peer_config(t, out / "configs" / arm / f"{name}.yaml", seeded)
        peers.append(Peer(name=name, config=cfg, state_dir=out / arm / name))
    return peers


def _run_arm(arm: str, args: argparse.Namespace, templates: list[Path], out: Path) -> dict[str, int]:
    from swarm_node.runs.live import LiveTable
    from swarm_node.runs.local_swarm import start_bootstrap, stop_processes

    swarm = arm == "swarm"
    peers = peer_configs(arm, args, templates, out)
    boot = None
    codes: dict[str, int] = {}
    try:
        if swarm:
            boot = start_bootstrap(out / "bootstrap", "demo")
            print(f"[demo] bootstrap peer at {boot.maddrs[0]}", flush=True)
        for p in peers:
            p.start(boot.maddrs if boot else None, args.log_level)
        print(f"[demo] {arm}: started {len(peers)} peers ({', '.join(p.name for p in peers)}); "
              f"logs in {out / arm}/<peer>/node.log", flush=True)
        if not swarm:
            print("[demo] alone first: each peer trains by itself (the baseline); then the same peers as a swarm, "
                  "with each one's gain over alone", flush=True)
        baseline = {p.name: out / "alone" / p.name / "metrics.jsonl" for p in peers} if swarm else None
        with LiveTable(f"{arm}: {args.rounds} rounds", peers, args.rounds, baseline=baseline) as live:
            while any(p.running() for p in peers):
                live.refresh()
                time.sleep(1.0)
            live.refresh()
    except KeyboardInterrupt:
        print("\n[demo] interrupted: stopping peers (they checkpoint first)", flush=True)
        raise
    finally:
        started = [p for p in peers if p.proc is not None]
        try:
            for p, code in zip(started, stop_processes([p.proc for p in started]), strict=True):
                codes[p.name] = code
        finally:
            if boot:
                boot.stop()
    for name, code in codes.items():
        if code != 0:
            log = out / arm / name / "node.log"
            tail = "".join(log.read_text().splitlines(keepends=True)[-15:]) if log.exists() else ""
            raise UserFacingError(f"peer {name} ({arm}) exited with code {code}; last lines of {log}:\n{tail}")
    return codes


def _start_dashboard(out: Path, port: int):
    """The live page of this demo's dir (swarm-node dashboard's), served from a thread of this process."""
    from swarm_node.dashboard.server import serve_dirs

    if port < 0:
        return None
    try:
        server, url = serve_dirs([out], port, what="--dashboard-port", title=f"demo {out.name}")
    except UserFacingError:
        if port == 0 or port != DASHBOARD_PORT:
            raise
        server, url = serve_dirs([out], 0, what="--dashboard-port", title=f"demo {out.name}")
        print(f"[demo] port {port} is taken: serving the page on another one", flush=True)
    print(f"[demo] dashboard: {url} (live while the demo runs; afterwards: swarm-node dashboard {out})", flush=True)
    return server


def _task_names(templates: list[Path], task: str | None) -> set[str]:
    import yaml

    return {task or ((yaml.safe_load(t.read_text()) or {}).get("task") or {}).get("name", "arithmetic")
            for t in templates}


def _check_specialise(templates: list[Path], task: str | None) -> None:
    """--specialise splits the arithmetic task's parts: every peer must run that task."""
    names = _task_names(templates, task)
    if names != {"arithmetic"}:
        raise UserFacingError(f"--specialise gives each peer one part of the arithmetic task, but these peers run "
                              f"{', '.join(sorted(names))}; drop --specialise or use arithmetic peers")


def _tiny_presets(templates: list[Path]) -> bool:
    import yaml

    from swarm_node.models.presets import PRESETS

    return all(((yaml.safe_load(t.read_text()) or {}).get("model") or {}).get("path", "tiny-s") in PRESETS
               for t in templates)


def resolve_defaults(args: argparse.Namespace, templates: list[Path]) -> None:
    """The defaults that depend on the peers. Tiny arithmetic peers (the default's) specialise, with their
    alone baseline, on 1200 problems: the setting docs/results/learning.md measured a gain over alone in. Other
    peers (reasoning-gym, gsm8k, a real model's chat arithmetic, sized in its config) keep their own task
    and arms; --specialise on a task other than arithmetic is one clear error."""
    if args.specialise is None:
        args.specialise = _task_names(templates, args.task) == {"arithmetic"} and _tiny_presets(templates)
    elif args.specialise:
        _check_specialise(templates, args.task)
    if args.compare_alone is None:
        args.compare_alone = args.specialise
    if args.eval_n is None and args.specialise:
        args.eval_n = SPECIALISED_EVAL_N
    if args.rounds is None:
        args.rounds = default_rounds(templates)


def run(args: argparse.Namespace) -> int:
    import shutil

    from swarm_node.commands._preflight import writable_dir
    from swarm_node.dashboard.server import stop

    templates = [_resolve_peer(s) for s in args.peers]
    resolve_defaults(args, templates)
    out = writable_dir(args.out, "--out").resolve()
    if out.exists():
        for arm in ("swarm", "alone", "configs", "bootstrap"):
            shutil.rmtree(out / arm, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    server = _start_dashboard(out, args.dashboard_port)
    try:
        return _run_and_report(args, templates, out, t0)
    finally:
        if server is not None:
            stop(server)


def _run_and_report(args: argparse.Namespace, templates: list[Path], out: Path, t0: float) -> int:
    from swarm_node.runs.report import write_report

    _build_presets(templates)
    interrupted = False
    try:
        if args.compare_alone:  # first, so that the swarm's live table shows its gain over alone as it goes
            _run_arm("alone", args, templates, out)
        _run_arm("swarm", args, templates, out)
    except KeyboardInterrupt:  # Ctrl-C: the peers have stopped; report the rounds they did
        interrupted = True
    command = "swarm-node " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "swarm-node demo"
    try:
        report = write_report(out, {"command": command, "rounds": args.rounds,
                                    "task": args.task or "per peer config", "peers": _peer_names(templates),
                                    "seconds": round(time.time() - t0, 1),
                                    **({"interrupted": True} if interrupted else {})})
    except FileNotFoundError:
        if not interrupted:
            raise
        print("[demo] interrupted before any peer logged a round: no report", flush=True)
        return 130
    print()
    print((out / "report.md").read_text())
    for arm, peers in report["arms"].items():
        for peer, s in peers.items():
            print(f"[demo] {peer:12s} {arm:5s}: eval accuracy {s['start_accuracy']} -> {s['end_accuracy']}, "
                  f"external groups {s['external_groups']}, filtered {s['filtered']}")
    for peer, g in report.get("gain_over_alone", {}).items():
        print(f"[demo] {peer:12s} gain over alone: {g['gain']:+.3f} +- {g['se']:.3f} ({g['verdict']}; one run, "
              f"{'paired per problem' if g['paired'] else 'unpaired'})")
    print(f"[demo] report: {out / 'report.md'}; plots: {out / 'reward.png'}, {out / 'accuracy.png'} "
          f"({time.time() - t0:.0f}s)")
    if args.dashboard_port >= 0:
        print(f"[demo] the live page stopped with the demo; to open it again: swarm-node dashboard {out}")
    if interrupted:
        done = {p: s["rounds"] for peers in report["arms"].values() for p, s in peers.items()}
        print(f"[demo] interrupted: the report covers the rounds done ({', '.join(f'{p} {r}' for p, r in done.items())}"
              f" of {args.rounds})", flush=True)
        return 130
    return 0
