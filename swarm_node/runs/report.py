"""Summaries and plots of a run directory, from the metrics.jsonl files alone.

Layouts read: a demo directory, RUN_DIR/swarm/<peer>/metrics.jsonl and, when the alone baseline was run,
RUN_DIR/alone/<peer>/metrics.jsonl; or one node's state dir, RUN_DIR/metrics.jsonl (arm "node"). Writes
report.json, report.md, reward.png and accuracy.png into RUN_DIR.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from swarm_node.node.metrics import read_metrics
from swarm_node.node.progress import fmt

ARMS = ("swarm", "alone")
NODE_ARM = "node"  # a single node's state dir
SMOOTH_ROUNDS = 5


def _is_dpo(rows: list[dict]) -> bool:
    return any("dpo_loss" in r for r in rows)


def _evals(rows: list[dict]) -> list[tuple[int, float]]:
    """(round, held-out accuracy): greedy exact match (GRPO) or preference accuracy (DPO)."""
    key = "heldout_pref_acc" if _is_dpo(rows) else "eval_accuracy"
    return [(r["round"], r[key]) for r in rows if r.get(key) is not None]


def _rewards(rows: list[dict]) -> list[tuple[int, float]]:
    """(round, training signal): mean reward of own samples (GRPO) or train preference accuracy (DPO)."""
    key = "train_pref_acc" if _is_dpo(rows) else "reward_mean"
    return [(r["round"], r[key]) for r in rows if r.get(key) is not None]


def _peer_summary(rows: list[dict]) -> dict:
    evals = _evals(rows)
    # GRPO's round 0 is the eval of the model as loaded; DPO's round 0 already trains
    trained = rows if _is_dpo(rows) else [r for r in rows if r.get("round", 0) > 0]
    rewards = [v for _, v in _rewards(rows)]
    rej: dict[str, int] = {}
    ext_by_peer: dict[str, int] = {}
    for r in trained:
        for k, v in (r.get("rejected") or {}).items():
            rej[k] = rej.get(k, 0) + int(v)
        for k, v in (r.get("external_groups_by_peer") or {}).items():
            ext_by_peer[k] = ext_by_peer.get(k, 0) + int(v)

    def total(key: str) -> int:
        return int(sum(r.get(key) or 0 for r in trained))

    q = max(1, len(rewards) // 4)
    static = next((r for r in rows if r.get("round") == 0), {})
    return {
        "model": static.get("model"),  # name, preset, sha256 of the preset's weights (round-0 row)
        "rounds": (trained[-1]["round"] + (1 if _is_dpo(rows) else 0)) if trained else 0,
        "start_accuracy": evals[0][1] if evals else None,
        "end_accuracy": evals[-1][1] if evals else None,
        "best_accuracy": max(a for _, a in evals) if evals else None,
        "accuracy_curve": evals,
        "reward_first_quarter": float(np.mean(rewards[:q])) if rewards else None,
        "reward_last_quarter": float(np.mean(rewards[-q:])) if rewards else None,
        "local_groups": total("local_groups"),
        "external_groups": total("external_groups"),
        "external_groups_by_peer": ext_by_peer,
        "filtered": total("filtered"),
        "rejected": rej,
        "rewards_overridden": total("rewards_overridden"),
        "bytes_out": total("bytes_out") + total("bytes_sent"),
        "bytes_in": total("bytes_in") + total("bytes_received"),
        "gen_s_mean": float(np.mean([r.get("gen_s") or 0 for r in trained])) if trained else None,
        "train_s_mean": float(np.mean([r.get("train_s") or 0 for r in trained])) if trained else None,
        "collect_s_mean": float(np.mean([r.get("collect_s") or 0 for r in trained])) if trained else None,
    }


def load_run(run_dir: Path) -> dict[str, dict[str, list[dict]]]:
    """{arm: {peer: rows}} for the arms present; a node's state dir is one arm ("node") of one peer."""
    out: dict[str, dict[str, list[dict]]] = {}
    single = Path(run_dir) / "metrics.jsonl"
    if single.is_file():
        rows = read_metrics(single)
        name = Path(run_dir).resolve().name
        return {NODE_ARM: {name: rows}} if rows else {}
    for arm in ARMS:
        d = Path(run_dir) / arm
        if not d.is_dir():
            continue
        peers = {p.name: read_metrics(p / "metrics.jsonl") for p in sorted(d.iterdir()) if (p / "metrics.jsonl").exists()}
        if peers:
            out[arm] = peers
    return out


def rolling(values: list[float], k: int = SMOOTH_ROUNDS) -> tuple[np.ndarray, np.ndarray]:
    """Trailing mean and standard deviation over the last k values (fewer at the start), one per value."""
    v = np.asarray(values, dtype=float)
    mean = np.array([v[max(0, i - k + 1): i + 1].mean() for i in range(len(v))])
    std = np.array([v[max(0, i - k + 1): i + 1].std() for i in range(len(v))])
    return mean, std


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
    dpo = any(_is_dpo(rows) for arm in run.values() for rows in arm.values())
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
                pts = _rewards(rows) if kind == "reward" else _evals(rows)
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
    lines += ["| peer | arm | rounds | eval acc start | eval acc end | best | reward 1st quarter | reward last quarter "
              "| external groups | filtered | rejected | sent | received |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, peers in report["arms"].items():
        for peer, s in peers.items():
            rej = sum(s["rejected"].values())
            lines.append(
                f"| {peer} | {arm} | {s['rounds']} | {fmt(s['start_accuracy'])} | {fmt(s['end_accuracy'])} | "
                f"{fmt(s['best_accuracy'])} | {fmt(s['reward_first_quarter'])} | {fmt(s['reward_last_quarter'])} | "
                f"{s['external_groups']} | {s['filtered']} | {rej} | {_bytes(s['bytes_out'])} | {_bytes(s['bytes_in'])} |"
            )
    lines += ["", "Eval accuracy is greedy exact match on the held-out split; rewards are of each peer's own",
              "samples. `external groups` counts peers' groups trained on; `filtered` counts sequences the F-TIS",
              "filter dropped; `rejected` counts peers' batches or groups declined (reason in report.json).", "",
              "The reward plot is a rolling mean over 5 rounds with a +-1 std band: each round's reward is the mean",
              "over a few prompts' sampled (temperature) completions, so it is noisy and need not follow the greedy",
              "held-out accuracy round by round; both plots share the round axis.", "",
              "![reward](reward.png)", "", "![accuracy](accuracy.png)", ""]
    return "\n".join(lines)


def write_report(run_dir: Path, extra: dict | None = None) -> dict:
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    if not run:
        raise FileNotFoundError(f"no metrics.jsonl with rows in {run_dir} (a node's --state-dir) nor under "
                                f"{run_dir}/swarm/*/ or {run_dir}/alone/*/ (a `swarm-node demo --out` dir)")
    report = {"run_dir": str(run_dir), **(extra or {}),
              "arms": {arm: {peer: _peer_summary(rows) for peer, rows in peers.items()} for arm, peers in run.items()}}
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    (run_dir / "report.md").write_text(markdown(report))
    plot(run, run_dir)
    return report
