"""Summaries and plots of a run directory, from the metrics.jsonl files alone.

Layouts read: a demo directory, RUN_DIR/swarm/<peer>/metrics.jsonl and, when the alone baseline was run,
RUN_DIR/alone/<peer>/metrics.jsonl; or one node's state dir, RUN_DIR/metrics.jsonl (arm "node"). Writes
report.json, report.md, reward.png and accuracy.png into RUN_DIR, and accuracy_parts.png when the task has
parts (metrics' eval_acc_parts: arithmetic's add / sub / signed, reasoning-gym's datasets).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from swarm_node.dashboard import summary
from swarm_node.dashboard.layout import NODE_ARM, metrics_files
from swarm_node.node import reasons
from swarm_node.node.metrics import read_metrics
from swarm_node.node.progress import fmt
from swarm_node.runs.stats import gain_with_se

SMOOTH_ROUNDS = summary.SMOOTH_ROUNDS
rolling = summary.rolling  # the reward plot's trailing mean and band (the dashboard draws the same)


def load_run(run_dir: Path) -> dict[str, dict[str, list[dict]]]:
    """{arm: {peer: rows}} for the arms present; a node's state dir is one arm ("node") of one peer."""
    files = metrics_files(run_dir)
    if NODE_ARM in files:
        rows = {peer: read_metrics(path) for peer, path in files[NODE_ARM].items()}
        return {NODE_ARM: rows} if all(rows.values()) else {}
    return {arm: {peer: read_metrics(path) for peer, path in peers.items()} for arm, peers in files.items()}


def plot(run: dict, out_dir: Path) -> list[Path]:
    """reward.png (rolling mean of the training signal, +-1 std band) and accuracy.png, on one round axis.

    Both plots share the x range, so a reward curve can be read against the accuracy measured at the same
    rounds; the band shows how much one round's reward jumps around the mean (small prompt batches).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    peers = sorted({p for arm in run.values() for p in arm})
    dpo = any(summary.is_dpo(rows) for arm in run.values() for rows in arm.values())
    last = max((r.get("round", 0) for arm in run.values() for rows in arm.values() for r in rows), default=1)
    reward_label = "train preference accuracy" if dpo else "mean reward of own samples"
    acc_label = "held-out preference accuracy" if dpo else "held-out eval accuracy (greedy)"
    written = []
    for kind, ylabel, fname in (("reward", f"{reward_label} ({SMOOTH_ROUNDS}-round mean, band: +-1 std)",
                                 "reward.png"), ("accuracy", acc_label, "accuracy.png")):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for i, peer in enumerate(peers):
            color = colors[i % len(colors)]
            for arm, style in (("swarm", "-"), ("node", "-"), ("alone", "--")):
                rows = run.get(arm, {}).get(peer)
                if not rows:
                    continue
                pts = summary.rewards(rows) if kind == "reward" else summary.evals(rows)
                if not pts:
                    continue
                xs = np.array([p[0] for p in pts])
                label = peer if arm == NODE_ARM else f"{peer} ({arm})"
                if kind == "reward":
                    mean, std = rolling([p[1] for p in pts])
                    ax.plot(xs, mean, style, color=color, label=label)
                    ax.fill_between(xs, mean - std, mean + std, color=color, alpha=0.07 if arm == "alone" else 0.15,
                                    linewidth=0)
                else:
                    ax.plot(xs, [p[1] for p in pts], style, color=color, marker="o", markersize=3, label=label)
        ax.set_xlim(0, max(1, last))
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers (short runs showed 0.25)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.set_title("swarm (solid) vs alone (dashed)" if "alone" in run else
                     ("one node" if NODE_ARM in run else "swarm peers"))
        fig.tight_layout()
        path = Path(out_dir) / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def gain_over_alone(report: dict) -> dict[str, dict]:
    """Per peer run in both arms: swarm end accuracy - alone end accuracy, its SE and the 2-SE verdict.

    Paired per problem when both final evals scored the same problems (metrics' eval_hits); otherwise the
    unpaired SE of two accuracies (larger). One run: the SE is that of the problems drawn, not of seeds.
    """
    swarm, alone = report["arms"].get("swarm", {}), report["arms"].get("alone", {})
    out: dict[str, dict] = {}
    for peer, s in swarm.items():
        a = alone.get(peer)
        if a is None or s["end_accuracy"] is None or a["end_accuracy"] is None:
            continue
        out[peer] = gain_with_se(s["end_accuracy"], a["end_accuracy"], s.get("end_hits"), a.get("end_hits"),
                                 s.get("end_n"), a.get("end_n"))
    return out


def plot_parts(run: dict, out_dir: Path) -> Path | None:
    """accuracy_parts.png: one panel per part of the task, each peer's held-out accuracy on it over rounds
    (swarm solid, alone dashed); None when no peer's metrics have parts."""
    curves = {(arm, peer): summary.part_evals(rows) for arm, peers in run.items() for peer, rows in peers.items()}
    parts = list(dict.fromkeys(k for pts in curves.values() for _, acc in pts for k in acc))
    if not parts:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    peers = sorted({p for _, p in curves})
    fig, axes = plt.subplots(1, len(parts), figsize=(3.8 * len(parts), 3.4), squeeze=False, sharey=True)
    for ax, part in zip(axes[0], parts, strict=True):
        for (arm, peer), pts in sorted(curves.items()):
            pts = [(r, acc[part]) for r, acc in pts if part in acc]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], "--" if arm == "alone" else "-", marker="o",
                        markersize=2, color=colors[peers.index(peer) % len(colors)],
                        label=peer if arm == NODE_ARM else f"{peer} ({arm})")
        ax.set_title(part, fontsize=9)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out accuracy per part (greedy)", fontsize=9)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path = Path(out_dir) / "accuracy_parts.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bytes(n: int) -> str:
    """Human-readable size: tiny-preset runs move kilobytes, real models megabytes (fixed MB read 0.00)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def markdown(report: dict) -> str:
    lines = ["# swarm-node run report", ""]
    if report.get("command"):
        lines += [f"Command: `{report['command']}`", ""]
    if report.get("interrupted"):
        lines += [f"Interrupted (Ctrl-C) before the {report.get('rounds')} rounds asked for: each row covers the "
                  "rounds that peer did.", ""]
    gains = report.get("gain_over_alone") or {}
    lines += gains_table(report)
    gain_col = " gain over alone |" if gains else ""
    lines += ["| peer | arm | rounds | eval acc start | eval acc end |" + gain_col + " best | reward 1st quarter "
              "| reward last quarter | external groups | filtered | rejected | sent | received |",
              "|---|---|---|---|---|" + ("---|" if gains else "") + "---|---|---|---|---|---|---|---|"]
    for arm, peers in report["arms"].items():
        for peer, s in peers.items():
            rej = sum(s["rejected"].values())
            g = gains.get(peer) if arm == "swarm" else None
            cell = (f" {g['gain']:+.3f} +- {g['se']:.3f} ({g['verdict']}) |" if g else " - |") if gains else ""
            lines.append(
                f"| {peer} | {arm} | {s['rounds']} | {fmt(s['start_accuracy'])} | {fmt(s['end_accuracy'])} |{cell} "
                f"{fmt(s['best_accuracy'])} | {fmt(s['reward_first_quarter'])} | {fmt(s['reward_last_quarter'])} | "
                f"{s['external_groups']} | {s['filtered']} | {rej} | {_bytes(s['bytes_out'])} | {_bytes(s['bytes_in'])} |"
            )
    lines += _parts_table(report)
    lines += ["", "Eval accuracy is greedy exact match on the held-out split; rewards are of each peer's own",
              "samples. `external groups` counts peers' groups trained on; `filtered` counts sequences the F-TIS",
              "filter dropped; `rejected` counts peers' batches or groups declined (reason in report.json).", "",
              "The reward plot is a rolling mean over 5 rounds with a +-1 std band: each round's reward is the mean",
              "over a few prompts' sampled (temperature) completions, so it is noisy and need not follow the greedy",
              "held-out accuracy round by round; both plots share the round axis.", "",
              "![reward](reward.png)", "", "![accuracy](accuracy.png)", ""]
    if any(s.get("end_accuracy_parts") for peers in report["arms"].values() for s in peers.values()):
        lines += ["![accuracy per part](accuracy_parts.png)", ""]
    return "\n".join(lines + rejections_table(report))


def gains_table(report: dict) -> list[str]:
    """Markdown lines: what the swarm gave each peer, the run's headline (none without an alone arm)."""
    gains = report.get("gain_over_alone") or {}
    if not gains:
        return []
    swarm, alone = report["arms"]["swarm"], report["arms"]["alone"]
    ns = sorted({n for p in gains for n in (swarm[p].get("end_n"), alone[p].get("end_n")) if n})
    problems = f"the {ns[0]} held-out problems" if len(ns) == 1 else "the held-out problems"
    lines = ["## Gain over alone", "",
             f"Each peer's accuracy on {problems} at the end of the swarm run minus the same peer trained alone "
             "for the same rounds, +- its standard error "
             + ("paired per problem" if all(g["paired"] for g in gains.values())
                else "(unpaired: the runs scored different problems)")
             + ". `higher` / `lower`: beyond 2 SE; `cannot tell`: gain +- 2 SE includes zero.", "",
             "| peer | samples | alone: acc start -> end | swarm: acc start -> end | gain over alone | verdict |",
             "|---|---|---|---|---|---|"]
    for peer, g in gains.items():
        s, a = swarm[peer], alone[peer]
        mix = ", ".join(k for k, w in (s.get("task_mix") or {}).items() if w > 0) or "-"
        lines.append(f"| {peer} | {mix} | {fmt(a['start_accuracy'])} -> {fmt(a['end_accuracy'])} | "
                     f"{fmt(s['start_accuracy'])} -> {fmt(s['end_accuracy'])} | {g['gain']:+.3f} +- {g['se']:.3f} | "
                     f"{g['verdict']} |")
    return lines + ["", "One run: the SE counts the eval problems drawn, not the spread between seeds "
                    "(`--seed S` runs another seed; docs/results/learning.md has the same setting over 5 seeds).", ""]


def rejections_table(report: dict) -> list[str]:
    """Markdown lines: every reason peers' data was declined for, over all peers, with what it means.

    Meanings come from the node's registry (node/reasons.py); a reason an older version counted and this
    one does not (say `stale`) is listed as such, so old runs still report."""
    totals: dict[str, int] = {}
    for peers in report["arms"].values():
        for s in peers.values():
            for reason, n in s["rejected"].items():
                totals[reason] = totals.get(reason, 0) + n
    if not totals:
        return []
    lines = ["## Rejections by reason", "", "| reason | count | what it means |", "|---|---|---|"]
    for reason, n in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| `{reason}` | {n} | {reasons.describe(reason) or 'not a reason of this version'} |")
    return lines + [""]


def _parts_table(report: dict) -> list[str]:
    """Held-out accuracy per part, start -> end, per peer and arm, with the parts each peer samples."""
    rows = [(arm, peer, s) for arm, peers in report["arms"].items() for peer, s in peers.items()
            if s.get("end_accuracy_parts")]
    if not rows:
        return []
    parts = list(dict.fromkeys(k for _, _, s in rows for k in s["end_accuracy_parts"]))
    out = ["", "Held-out accuracy per part (start -> end; the eval's union is the table above):", "",
           "| peer | arm | samples | " + " | ".join(parts) + " |", "|---|---|---|" + "---|" * len(parts)]
    for arm, peer, s in rows:
        mix = ", ".join(k for k, w in (s.get("task_mix") or {}).items() if w > 0) or "-"
        start, end = s.get("start_accuracy_parts") or {}, s["end_accuracy_parts"]
        out.append(f"| {peer} | {arm} | {mix} | " + " | ".join(
            f"{fmt(start.get(k))} -> {fmt(end.get(k))}" for k in parts) + " |")
    return out


def write_report(run_dir: Path, extra: dict | None = None) -> dict:
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    if not run:
        raise FileNotFoundError(f"no metrics.jsonl with rows in {run_dir} (a node's --state-dir) nor under "
                                f"{run_dir}/swarm/*/ or {run_dir}/alone/*/ (a `swarm-node demo --out` dir)")
    report = {"run_dir": str(run_dir), **(extra or {}),
              "arms": {arm: {peer: summary.peer_summary(rows) for peer, rows in peers.items()}
                       for arm, peers in run.items()}}
    report["gain_over_alone"] = gain_over_alone(report)
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    (run_dir / "report.md").write_text(markdown(report))
    plot(run, run_dir)
    plot_parts(run, run_dir)
    return report
