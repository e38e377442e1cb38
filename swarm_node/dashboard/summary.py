"""The numbers of a run, from metrics.jsonl rows: one place for `swarm-node report` and the dashboard page.

`peer_summary` is what report.json holds per peer; `peer_series` adds what the page plots round by round
(rolling reward, per-part accuracy, F-TIS filter share and ratios, the round's time split). Both take plain
row dicts, so the report (whole files) and the page (files read as they grow) get the same numbers.
"""

from __future__ import annotations

import numpy as np

SMOOTH_ROUNDS = 5
# per-part held-out accuracy: `eval_accuracy/<part>`-style flat keys, or a dict of part -> accuracy under a key
# such as `eval_accuracy_by_part`; any numeric key or dict starting with this prefix other than the total
PART_PREFIXES = ("eval_acc",)
TOTAL_ACCURACY_KEYS = ("eval_accuracy", "heldout_pref_acc")
NOT_TIME_KEYS = frozenset({"time"})  # the row's wall-clock timestamp; "<what>_per_s" are rates; other "_s" durations


def is_dpo(rows: list[dict]) -> bool:
    return any("dpo_loss" in r for r in rows)


def evals(rows: list[dict]) -> list[tuple[int, float]]:
    """(round, held-out accuracy): greedy exact match (GRPO) or preference accuracy (DPO)."""
    key = "heldout_pref_acc" if is_dpo(rows) else "eval_accuracy"
    return [(r["round"], r[key]) for r in rows if r.get(key) is not None]


def rewards(rows: list[dict]) -> list[tuple[int, float]]:
    """(round, training signal): mean reward of own samples (GRPO) or train preference accuracy (DPO)."""
    key = "train_pref_acc" if is_dpo(rows) else "reward_mean"
    return [(r["round"], r[key]) for r in rows if r.get(key) is not None]


def trained_rows(rows: list[dict]) -> list[dict]:
    """GRPO's round 0 is the eval of the model as loaded; DPO's round 0 already trains."""
    return rows if is_dpo(rows) else [r for r in rows if r.get("round", 0) > 0]


def peer_summary(rows: list[dict]) -> dict:
    """One peer's totals and accuracies, as report.json holds them."""
    evals_ = evals(rows)
    trained = trained_rows(rows)
    rewards_ = [v for _, v in rewards(rows)]
    rej: dict[str, int] = {}
    ext_by_peer: dict[str, int] = {}
    for r in trained:
        for k, v in (r.get("rejected") or {}).items():
            rej[k] = rej.get(k, 0) + int(v)
        for k, v in (r.get("external_groups_by_peer") or {}).items():
            ext_by_peer[k] = ext_by_peer.get(k, 0) + int(v)

    def total(key: str) -> int:
        return int(sum(r.get(key) or 0 for r in trained))

    q = max(1, len(rewards_) // 4)
    static = next((r for r in rows if r.get("round") == 0), {})
    parts = part_evals(rows)
    scored = [r for r in rows if r.get("eval_hits")]
    evals_n = [r["eval_n"] for r in rows if r.get("eval_accuracy") is not None and r.get("eval_n")]
    return {
        "model": static.get("model"),  # name, preset, sha256 of the preset's weights (round-0 row)
        "task_mix": static.get("task_mix"),  # the parts this peer samples (a local setting)
        "start_accuracy_parts": parts[0][1] if parts else None,
        "end_accuracy_parts": parts[-1][1] if parts else None,
        "accuracy_curve_parts": parts,
        "end_hits": scored[-1]["eval_hits"] if scored else None,  # per problem: pairs the swarm with alone
        "end_n": evals_n[-1] if evals_n else None,
        "rounds": (trained[-1]["round"] + (1 if is_dpo(rows) else 0)) if trained else 0,
        "start_accuracy": evals_[0][1] if evals_ else None,
        "end_accuracy": evals_[-1][1] if evals_ else None,
        "best_accuracy": max(a for _, a in evals_) if evals_ else None,
        "accuracy_curve": evals_,
        "reward_first_quarter": float(np.mean(rewards_[:q])) if rewards_ else None,
        "reward_last_quarter": float(np.mean(rewards_[-q:])) if rewards_ else None,
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


def part_evals(rows: list[dict]) -> list[tuple[int, dict[str, float]]]:
    """(round, {part: held-out accuracy}) for tasks with parts (the rows' eval_acc_parts); [] otherwise."""
    return [(r["round"], r["eval_acc_parts"]) for r in rows if r.get("eval_acc_parts")]


def rolling(values: list[float], k: int = SMOOTH_ROUNDS) -> tuple[np.ndarray, np.ndarray]:
    """Trailing mean and standard deviation over the last k values (fewer at the start), one per value."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return v.copy(), v.copy()
    # windows of k over the values with k-1 NaNs in front: the first windows hold fewer values
    windows = np.lib.stride_tricks.sliding_window_view(np.concatenate([np.full(k - 1, np.nan), v]), k)
    with np.errstate(invalid="ignore"):  # an inf reward makes its windows NaN, without a warning per window
        return np.nanmean(windows, axis=1), np.nanstd(windows, axis=1)


def _number(v: object) -> bool:
    return type(v) is float or type(v) is int  # JSON numbers; not bool (an int subclass), not None


def _keys(rows: list[dict]) -> set[str]:
    return set().union(*(r.keys() for r in rows)) if rows else set()


def part_accuracies(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """{part: [(round, accuracy)]} from whatever per-part eval keys the rows carry (none: {}).

    Flat keys (`eval_accuracy/<part>`, `eval_acc_part/<part>`, ...) name the part by what follows the key's
    last `/` or, without one, the key itself; dict keys (`eval_accuracy_by_part: {part: acc}`) by the dict's.
    """
    candidates = [k for k in _keys(rows) if k.startswith(PART_PREFIXES) and k not in TOTAL_ACCURACY_KEYS
                  and not k.endswith("_n")]
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        for key in candidates:
            v = r.get(key)
            if isinstance(v, dict):
                for part, acc in v.items():
                    if _number(acc):
                        out.setdefault(str(part), []).append((r["round"], float(acc)))
            elif _number(v):
                out.setdefault(key.rsplit("/", 1)[-1], []).append((r["round"], float(v)))
    return out


def time_keys(rows: list[dict]) -> list[str]:
    """The round's time split: every numeric `<what>_s` key the rows carry (gen_s, train_s, collect_s, ...),
    not rates (`tokens_per_s`)."""
    wanted = {k for k in _keys(rows) if k.endswith("_s") and not k.endswith("_per_s") and k not in NOT_TIME_KEYS}
    order: dict[str, int] = {}
    for r in rows:  # the order the rows name them in; stops once every key is placed
        for k in r:
            if k in wanted and k not in order:
                order[k] = len(order)
        if len(order) == len(wanted):
            break
    return [k for k in sorted(wanted, key=order.__getitem__) if any(_number(r.get(k)) for r in rows)]


def filtered_share(row: dict) -> float | None:
    """Share of the round's sequences the F-TIS filter dropped: filtered / (filtered + kept); None if neither."""
    filtered, kept = row.get("filtered"), row.get("kept")
    if not _number(filtered) or not _number(kept) or filtered + kept <= 0:
        return None
    return filtered / (filtered + kept)


def thin(points: list, max_points: int) -> list:
    """At most max_points of a series, evenly strided, always keeping the last (the round that just landed)."""
    if max_points <= 0 or len(points) <= max_points:
        return points
    step = -(-len(points) // max_points)
    kept = points[::step]
    return kept if kept[-1] is points[-1] else [*kept, points[-1]]


def peer_series(rows: list[dict], max_points: int = 2000) -> dict:
    """What the page plots and shows beside peer_summary, each series as [(round, value)], thinned to max_points."""
    trained = trained_rows(rows)
    reward_pts = rewards(rows)
    mean, _ = rolling([v for _, v in reward_pts]) if reward_pts else (np.array([]), None)
    rolling_reward = [(r, float(m)) for (r, _), m in zip(reward_pts, mean, strict=True)]
    share = [(r["round"], s) for r in trained if (s := filtered_share(r)) is not None]
    ratios = {key: [(r["round"], float(r[key])) for r in trained if _number(r.get(key))]
              for key in ("mean_ratio_external", "mean_ratio_local")}
    times = {key: [float(r[key]) for r in trained if _number(r.get(key))] for key in time_keys(trained)}
    filtered = sum(int(r.get("filtered") or 0) for r in trained)
    kept = sum(int(r.get("kept") or 0) for r in trained)
    ext_ratio = ratios["mean_ratio_external"]
    parts = part_accuracies(rows)
    last = rows[-1] if rows else {}
    return {
        "round": last.get("round", 0),
        "time": last.get("time"),
        "dpo": is_dpo(rows),
        "reward_rolling": rolling_reward[-1][1] if rolling_reward else None,
        "filtered_share": filtered / (filtered + kept) if filtered + kept > 0 else None,
        "mean_ratio_external": float(np.mean([v for _, v in ext_ratio])) if ext_ratio else None,
        "time_split_mean": {key: float(np.mean(vals)) for key, vals in times.items() if vals},
        "parts_last": {part: pts[-1][1] for part, pts in parts.items()},
        "series": {
            "accuracy": thin(evals(rows), max_points),
            "parts": {part: thin(pts, max_points) for part, pts in parts.items()},
            "reward_rolling": thin(rolling_reward, max_points),
            "filtered_share": thin(share, max_points),
            **{key: thin(pts, max_points) for key, pts in ratios.items()},
        },
    }
