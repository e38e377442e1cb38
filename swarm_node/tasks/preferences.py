"""Preference pairs for DPO: JSONL files (plain or Anthropic-HH dialogues) and a synthetic non-IID task.

The synthetic task exists so that gossip averaging visibly matters on tiny character-level models: each
user asks about its own topic and prefers answers written with its own letters, so a node that sees only
its own user's pairs learns a preference that is wrong for other topics, while the consensus of all
nodes learns every topic's taste. The held-out set is a mixture over all users.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swarm_node.errors import UserFacingError

HH_ASSISTANT = "\n\nAssistant:"


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: for `prompt`, `chosen` is preferred to `rejected` (responses only, no prompt)."""

    prompt: str
    chosen: str
    rejected: str
    user: int | None = None


def split_hh(chosen: str, rejected: str) -> tuple[str, str, str]:
    """Anthropic-HH form: the prompt is the longest shared prefix cut at its last "\\n\\nAssistant:" turn.

    Raises ValueError (with the reason) when the dialogues share no assistant turn or do not differ.
    """
    n = 0
    limit = min(len(chosen), len(rejected))
    while n < limit and chosen[n] == rejected[n]:
        n += 1
    cut = chosen.rfind(HH_ASSISTANT, 0, n)
    if cut < 0:
        raise ValueError("'chosen' and 'rejected' share no '\\n\\nAssistant:' turn to split the prompt at")
    end = cut + len(HH_ASSISTANT)
    prompt, c, r = chosen[:end], chosen[end:], rejected[end:]
    if c == r:
        raise ValueError("'chosen' and 'rejected' are identical after the shared prompt")
    return prompt, c, r


def _parse_line(obj: object) -> PreferencePair:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    for key in ("chosen", "rejected"):
        if key not in obj:
            raise ValueError(f"missing key '{key}'")
        if not isinstance(obj[key], str) or not obj[key]:
            raise ValueError(f"'{key}' must be a non-empty string")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str):
            raise ValueError("'prompt' must be a string")
        if obj["chosen"] == obj["rejected"]:
            raise ValueError("'chosen' and 'rejected' are identical")
        return PreferencePair(obj["prompt"], obj["chosen"], obj["rejected"])
    return PreferencePair(*split_hh(obj["chosen"], obj["rejected"]))


def load_preference_file(path: str | Path) -> list[PreferencePair]:
    """Read a JSONL file of {prompt, chosen, rejected} or Anthropic-HH {chosen, rejected} lines.

    A bad line raises UserFacingError naming the file, the line number and the problem.
    """
    p = Path(path)
    if not p.is_file():
        raise UserFacingError(f"preference file not found: {p}")
    pairs: list[PreferencePair] = []
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                pairs.append(_parse_line(json.loads(line)))
            except (ValueError, json.JSONDecodeError) as exc:
                raise UserFacingError(f"{p}, line {lineno}: {exc}") from None
    if not pairs:
        raise UserFacingError(f"{p}: no preference pairs (empty file)")
    return pairs


LETTERS = "abcdefgh"
TOPICS = "ABCDEFGHIJKLMNOP"


class SyntheticPreferences:
    """Non-IID synthetic preferences for tiny char-level models.

    User u asks prompts like "37C=" (digits, then its topic letter) and prefers 3-letter answers made of
    its own window of 4 letters out of "abcdefgh" over answers made of the other 4. Windows of
    neighbouring users overlap by half, opposite users' windows are disjoint: tastes overlap but differ,
    and averaged over topics every letter is liked as often as disliked, so only a topic-aware model (the
    consensus of all users) does well on the mixture held-out set.
    """

    task_id = "synthetic-pref-v1"

    def __init__(self, num_users: int = 4, response_len: int = 3) -> None:
        if not 1 <= num_users <= len(TOPICS):
            raise ValueError(f"num_users must be in 1..{len(TOPICS)}, got {num_users}")
        self.num_users = num_users
        self.response_len = response_len

    def liked(self, user: int) -> str:
        start = (user * len(LETTERS)) // self.num_users
        return "".join(LETTERS[(start + k) % len(LETTERS)] for k in range(len(LETTERS) // 2))

    def _pair(self, user: int, rng: np.random.Generator) -> PreferencePair:
        liked = self.liked(user)
        disliked = "".join(c for c in LETTERS if c not in liked)
        prompt = f"{rng.integers(0, 100):02d}{TOPICS[user]}="
        chosen = "".join(rng.choice(list(liked), self.response_len))
        rejected = "".join(rng.choice(list(disliked), self.response_len))
        return PreferencePair(prompt, chosen, rejected, user)

    def user_pairs(self, user: int, n: int, seed: int = 0) -> list[PreferencePair]:
        """n training pairs of one user (its own rng stream, disjoint from the held-out stream)."""
        if not 0 <= user < self.num_users:
            raise ValueError(f"user must be in 0..{self.num_users - 1}, got {user}")
        rng = np.random.default_rng([seed, 1, user])
        return [self._pair(user, rng) for _ in range(n)]

    def heldout_pairs(self, n: int, seed: int = 0) -> list[PreferencePair]:
        """n pairs from the uniform mixture of all users (the same on every node)."""
        rng = np.random.default_rng([seed, 2])
        return [self._pair(int(rng.integers(0, self.num_users)), rng) for _ in range(n)]


@dataclass(frozen=True)
class NodePreferences:
    """What one DPO node trains and evaluates on."""

    train: list[PreferencePair]
    heldout: list[PreferencePair]
    task_id: str
    user: int | None


def node_preferences(
    data_path: str | None,
    eval_data_path: str | None = None,
    *,
    user: int | None = None,
    seed: int = 0,
    num_users: int = 4,
    pairs_per_user: int = 256,
    heldout_pairs: int = 256,
) -> NodePreferences:
    """The node's own pairs and the shared held-out pairs (synthetic task when data_path is None).

    Synthetic: user defaults to seed mod num_users; the held-out mixture is the same on every node.
    File: the held-out set is eval_data_path, or else the last 10% of the file.
    """
    if data_path is None:
        task = SyntheticPreferences(num_users)
        u = seed % num_users if user is None else user
        if u >= num_users:
            raise UserFacingError(f"dpo.user={u} but the synthetic task has dpo.num_users={num_users} users")
        return NodePreferences(task.user_pairs(u, pairs_per_user, seed=seed), task.heldout_pairs(heldout_pairs),
                               f"{task.task_id}-u{num_users}", u)
    pairs = load_preference_file(data_path)
    if eval_data_path is not None:
        return NodePreferences(pairs, load_preference_file(eval_data_path), "preference-file", None)
    if len(pairs) < 2:
        raise UserFacingError(f"{data_path}: need at least 2 pairs to hold out 10% (or set dpo.eval_data_path)")
    cut = max(1, len(pairs) // 10)
    return NodePreferences(pairs[:-cut], pairs[-cut:], "preference-file", None)
