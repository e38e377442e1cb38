"""The checks of scripts/compose-smoke.sh, on the files it copies into its work directory (stdlib only: it runs
on the host, outside the image).

    compose_smoke_check.py listing WORK SWARM                         print what `swarm-node status` listed
    compose_smoke_check.py grpo|dpo wait|final WORK ROUNDS PEER...    check the nodes' metrics.jsonl copies

`wait` is what the script polls while the nodes run: exit 1 (and one progress line) until every node has
trained ROUNDS rounds and, for GRPO, admitted groups from each other peer. `final` is the same check on the
whole files once the nodes stopped, with a report per node; exit 1 with the problems listed.

WORK holds status-<swarm>.json (`swarm-node status --json`) and metrics-<peer>.jsonl per node.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load_rows(path: Path, problems: list[str], final: bool) -> list[dict]:
    """The rows of a metrics.jsonl copy. A running node may be halfway through a line: skipped while waiting,
    a problem once it has stopped."""
    rows = []
    for ln in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(ln))
        except ValueError:
            if final:
                problems.append(f"{path.stem.removeprefix('metrics-')}: a line of metrics.jsonl is not JSON: {ln[:80]!r}")
    return rows


def listed(work: Path, swarm: str) -> list[dict]:
    return json.loads((work / f"status-{swarm}.json").read_text())


def check_grpo(work: Path, rounds: int, peers: list[str], final: bool) -> tuple[list[str], list[str], list[str]]:
    """(problems, progress, report): rounds 0..rounds (or more) each once, groups admitted from every other
    peer, each from a peer that status listed, and some of them trained on."""
    ids = {m["peer_id"] for m in listed(work, "demo")}
    problems: list[str] = []
    progress, report = [], []
    for peer in peers:
        rows = load_rows(work / f"metrics-{peer}.jsonl", problems, final)
        got = [r["round"] for r in rows]
        progress.append(f"{peer} round {got[-1] if got else '-'}")
        if got != list(range(len(got))):
            problems.append(f"{peer}: rounds {got}, expected 0, 1, 2, ... each once (a restart or a lost row)")
            continue
        if len(got) < rounds + 1:
            problems.append(f"{peer}: {max(len(got) - 1, 0)} of {rounds} rounds trained")
            continue
        by_model: dict[str, int] = {}
        for r in rows[1:]:
            for key, n in (r.get("external_groups_by_peer") or {}).items():
                suffix, _, model = key.partition(":")
                if len([pid for pid in ids if pid.endswith(suffix)]) != 1:
                    problems.append(f"{peer}: groups from {key}, a peer that `swarm-node status` did not list")
                by_model[model] = by_model.get(model, 0) + int(n)
        trained = sum(int(r.get("external_groups") or 0) for r in rows[1:])
        missing = [o for o in peers if o != peer and by_model.get(o, 0) <= 0]
        if missing:
            problems.append(f"{peer}: no groups admitted from {missing} yet (by model: {by_model})")
        if trained <= 0:
            problems.append(f"{peer}: trained on no external groups")
        evals = [r for r in rows if r.get("eval_accuracy") is not None]
        rejected: dict[str, int] = {}
        for r in rows[1:]:
            for k, n in (r.get("rejected") or {}).items():
                rejected[k] = rejected.get(k, 0) + int(n)
        report.append(f"  {peer:12s} {len(rows) - 1:3d} rounds: admitted groups from "
                      f"{', '.join(f'{m} {n}' for m, n in sorted(by_model.items()))}, {trained} of them trained on "
                      f"(non-zero advantage); eval accuracy {evals[0]['eval_accuracy']:.3f} (round 0) -> "
                      f"{evals[-1]['eval_accuracy']:.3f} (round {evals[-1]['round']}, n={evals[-1].get('eval_n')}), "
                      f"rejected {rejected or 'none'}")
    return problems, progress, report


def check_dpo(work: Path, rounds: int, peers: list[str], final: bool) -> tuple[list[str], list[str], list[str]]:
    """(problems, progress, report): `rounds` rounds (or more) per node; of the first `rounds`, at least half
    averaged with both ring neighbours among four peers; distinct peer ids, each listed by status."""
    ids_listed = {m["peer_id"] for m in listed(work, "dpo-demo")}
    problems: list[str] = []
    progress, done, ids = [], [], {}
    for peer in peers:
        rows = load_rows(work / f"metrics-{peer}.jsonl", problems, final)
        progress.append(f"{peer} {len(rows)} rounds")
        if len(rows) < rounds:
            problems.append(f"{peer}: {len(rows)} of {rounds} rounds trained")
            continue
        ids[peer] = rows[-1]["peer_id"]
        if ids[peer] not in ids_listed:
            problems.append(f"{peer}: peer id {ids[peer]} was not listed by `swarm-node status`")
        first = rows[:rounds]
        full = [r for r in first if r.get("num_peers") == 4 and len(r.get("neighbours") or []) == 2]
        if len(full) < rounds // 2:
            problems.append(f"{peer}: only {len(full)} of its first {rounds} rounds mixed with both ring neighbours "
                            "among 4 peers")
        acc = [r["heldout_pref_acc"] for r in first if r.get("heldout_pref_acc") is not None] or [float("nan")]
        done.append((peer, rows, f"{len(full)}/{rounds} first rounds averaged with both neighbours ({len(rows)} "
                     f"rounds in all); over rounds 0..{rounds - 1}: held-out preference accuracy {acc[0]:.3f} -> "
                     f"{acc[-1]:.3f}, consensus distance {first[0]['consensus_distance']:.3f} -> "
                     f"{first[-1]['consensus_distance']:.3f}"))
    if len(set(ids.values())) != len(ids):
        problems.append(f"peer ids not distinct: {ids}")
    name = {pid: peer for peer, pid in ids.items()}
    report = [f"  {peer}: neighbours {sorted({name.get(n, n) for r in rows for n in (r.get('neighbours') or [])})}, "
              f"{text}" for peer, rows, text in done]
    return problems, progress, report


def main(argv: list[str]) -> int:
    if argv[0] == "listing":
        members = listed(Path(argv[1]), argv[2])
        print(f"  `swarm-node status` listed {len(members)} live member(s):")
        for m in members:
            print(f"  {m['peer_id']}  {m['mode']:<4}  {m['model_name']:<12}  round {m['round']}")
        return 0
    kind, mode, work, rounds, peers = argv[0], argv[1], Path(argv[2]), int(argv[3]), argv[4:]
    check = {"grpo": check_grpo, "dpo": check_dpo}[kind]
    problems, progress, report = check(work, rounds, peers, final=mode == "final")
    if mode == "final":
        print("\n".join(report + ["  PROBLEM " + p for p in problems]))
    else:
        print(", ".join(progress) + (f"; {problems[0]}" if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
