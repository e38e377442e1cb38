"""Summaries and plots of a run directory, from the metrics.jsonl files alone.

Layout read: RUN_DIR/swarm/<peer>/metrics.jsonl and, when the alone baseline was run,
RUN_DIR/alone/<peer>/metrics.jsonl. Writes report.json, report.md, reward.png and accuracy.png.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from swarm_node.node.metrics import read_metrics

ARMS = ("swarm", "alone")


def _peer_summary(rows: list[dict]) -> dict:
    evals = [(r["round"], r["eval_accuracy"]) for r in rows if r.get("eval_accuracy") is not None]
    trained = [r for r in rows if r.get("round", 0) > 0]
    rewards = [r["reward_mean"] for r in trained if r.get("reward_mean") is not None]
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
        "rounds": trained[-1]["round"] if trained else 0,
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
        "bytes_out": total("bytes_out"),
        "bytes_in": total("bytes_in"),
        "gen_s_mean": float(np.mean([r.get("gen_s") or 0 for r in trained])) if trained else None,
        "train_s_mean": float(np.mean([r.get("train_s") or 0 for r in trained])) if trained else None,
        "collect_s_mean": float(np.mean([r.get("collect_s") or 0 for r in trained])) if trained else None,
    }


def load_run(run_dir: Path) -> dict[str, dict[str, list[dict]]]:
    """{arm: {peer: rows}} for the arms present."""
    out: dict[str, dict[str, list[dict]]] = {}
    for arm in ARMS:
        d = Path(run_dir) / arm
        if not d.is_dir():
            continue
        peers = {p.name: read_metrics(p / "metrics.jsonl") for p in sorted(d.iterdir()) if (p / "metrics.jsonl").exists()}
        if peers:
            out[arm] = peers
    return out


def _smooth(values: list[float], k: int = 5) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if len(v) < k:
        return v
    kernel = np.ones(k) / k
    head = [v[: i + 1].mean() for i in range(k - 1)]
    return np.concatenate([head, np.convolve(v, kernel, mode="valid")])


def plot(run: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    peers = sorted({p for arm in run.values() for p in arm})
    written = []
    for kind, ylabel, fname in (("reward", "mean reward of own samples (5-round mean)", "reward.png"),
                                ("accuracy", "held-out eval accuracy (greedy)", "accuracy.png")):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for i, peer in enumerate(peers):
            for arm, style in (("swarm", "-"), ("alone", "--")):
                rows = run.get(arm, {}).get(peer)
                if not rows:
                    continue
                if kind == "reward":
                    pts = [(r["round"], r["reward_mean"]) for r in rows if r.get("reward_mean") is not None]
                    xs, ys = [p[0] for p in pts], _smooth([p[1] for p in pts])
                else:
                    pts = [(r["round"], r["eval_accuracy"]) for r in rows if r.get("eval_accuracy") is not None]
                    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                if not pts:
                    continue
                ax.plot(xs, ys, style, color=colors[i % len(colors)], marker="o" if kind == "accuracy" else None,
                        markersize=3, label=f"{peer} ({arm})")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers (short runs showed 0.25)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("swarm (solid) vs alone (dashed)" if "alone" in run else "swarm peers")
        fig.tight_layout()
        path = Path(out_dir) / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _fmt(v, spec=".3f") -> str:
    return "-" if v is None else format(v, spec)


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
                f"| {peer} | {arm} | {s['rounds']} | {_fmt(s['start_accuracy'])} | {_fmt(s['end_accuracy'])} | "
                f"{_fmt(s['best_accuracy'])} | {_fmt(s['reward_first_quarter'])} | {_fmt(s['reward_last_quarter'])} | "
                f"{s['external_groups']} | {s['filtered']} | {rej} | {_bytes(s['bytes_out'])} | {_bytes(s['bytes_in'])} |"
            )
    lines += ["", "Eval accuracy is greedy exact match on the held-out split; rewards are of each peer's own",
              "samples. `external groups` counts peers' groups trained on; `filtered` counts sequences the F-TIS",
              "filter dropped; `rejected` counts peers' batches or groups declined (reason in report.json).", "",
              "![reward](reward.png)", "", "![accuracy](accuracy.png)", ""]
    return "\n".join(lines)


def write_report(run_dir: Path, extra: dict | None = None) -> dict:
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    if not run:
        raise FileNotFoundError(f"no metrics.jsonl under {run_dir}/swarm/*/ or {run_dir}/alone/*/")
    report = {"run_dir": str(run_dir), **(extra or {}),
              "arms": {arm: {peer: _peer_summary(rows) for peer, rows in peers.items()} for arm, peers in run.items()}}
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    (run_dir / "report.md").write_text(markdown(report))
    plot(run, run_dir)
    return report
