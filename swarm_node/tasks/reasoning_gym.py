"""reasoning-gym tasks: procedural problems from the suite rl-swarm trains on, scored by each dataset's own
`score_answer`.

A task is a weighted mixture of reasoning-gym datasets, each with its own generator config. Problem `i`
of a dataset is a pure function of (dataset, config, seed, i) (reasoning-gym seeds item i with
`Random(seed + i)`), so a prompt id `rg:<universe fp>:<dataset>:<i>` lets any peer with the same universe
(dataset names, configs, templates and seed; not the weights) rebuild the question and the reference entry,
and recompute the reward of a peer's completion locally. The weights are this node's mix: peers that sample
the same datasets in other proportions, or only some of them (weight 0), share a swarm.

Held-out problems are chosen by a hash of the *question text* (one in EVAL_MODULUS): the same problems on
every node, and a problem that the generator happens to produce under several indices is held out under
all of them, so no eval question ever appears in training, not even via a peer.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from swarm_node.errors import UserFacingError
from swarm_node.tasks.answers import first_line_answer
from swarm_node.tasks.base import Prompt, Task
from swarm_node.tasks.mix import parse_mix
from swarm_node.tasks.prompt_forms import check_form, question_text, task_id_for

EVAL_MODULUS = 10
SIZE = 1_000_000            # index range of each dataset (reasoning-gym needs a size; items are made on demand)
BASE_SEED = 20_250_101      # fixed: problem i is the same on every node
MAX_ID_LEN = 96
MAX_ANSWER_CHARS = 256      # completions are truncated to this before scoring (score_answer may be slow)
SHOTS = 2                   # solved examples in a "fewshot" prompt
_CACHE = 4096               # entries kept for rewarding (a round needs a few hundred)
_ID_RE = re.compile(r"rg:([0-9a-f]{8}):([a-z0-9_]{1,48}):(0|[1-9][0-9]{0,6})")


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    weight: float = 1.0
    config: dict = field(default_factory=dict)
    template: str | None = None  # prompt text from the entry, e.g. "{metadata[expression]} ="; None: the question


def parse_datasets(datasets: Any) -> list[DatasetSpec]:
    """`[chain_sum, gcd]` or `{chain_sum: {weight: 2, config: {max_terms: 2}}, gcd: {}}` -> specs.

    Raises UserFacingError naming the dataset and the problem (unknown name, bad weight, bad config).
    """
    if isinstance(datasets, str):
        datasets = [datasets]
    if isinstance(datasets, list | tuple):
        items = [(d, {}) for d in datasets]
    elif isinstance(datasets, dict):
        items = list(datasets.items())
    else:
        raise UserFacingError("task.datasets must be a list of reasoning-gym dataset names or a mapping "
                              "name -> {weight, config}")
    if not items:
        raise UserFacingError("task.datasets is empty: name at least one reasoning-gym dataset (e.g. chain_sum)")
    specs = []
    for name, opts in items:
        if not isinstance(name, str):
            raise UserFacingError(f"task.datasets: dataset names are strings, got {name!r}")
        opts = {} if opts is None else opts
        if not isinstance(opts, dict) or set(opts) - {"weight", "config", "template"}:
            raise UserFacingError(f"task.datasets.{name}: expected {{weight: <number>, config: {{...}}, "
                                  f"template: <text>}}, got {opts!r}")
        template = opts.get("template")
        if template is not None and (not isinstance(template, str) or not template):
            raise UserFacingError(f"task.datasets.{name}.template must be a non-empty string, got {template!r}")
        weight = opts.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight >= 0 or weight == float("inf"):
            raise UserFacingError(f"task.datasets.{name}.weight must be a non-negative number (0: in the universe, "
                                  f"never sampled here), got {weight!r}")
        config = opts.get("config") or {}
        if not isinstance(config, dict):
            raise UserFacingError(f"task.datasets.{name}.config must be a mapping, got {config!r}")
        specs.append(DatasetSpec(name, float(weight), dict(config), template))
    if len({s.name for s in specs}) != len(specs):
        raise UserFacingError("task.datasets names a dataset twice")
    return specs


def _make_dataset(spec: DatasetSpec, seed: int) -> Any:
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if spec.name not in DATASETS:
        raise UserFacingError(f"task.datasets: unknown reasoning-gym dataset {spec.name!r} "
                              f"({len(DATASETS)} available, e.g. chain_sum, basic_arithmetic, gcd, count_bits)")
    try:
        ds = reasoning_gym.create_dataset(spec.name, seed=seed, size=SIZE, **spec.config)
        entry = ds[0]
    except Exception as exc:  # the generator's own validation: report it in one line
        raise UserFacingError(f"task.datasets.{spec.name}: reasoning-gym refused the config "
                              f"{spec.config or '{}'} ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(entry.get("answer"), str) or not entry["answer"]:
        raise UserFacingError(f"task.datasets.{spec.name}: this dataset has no gold answer, so it cannot be "
                              "trained on with a verifiable reward")
    if spec.template is not None:
        try:
            text = _render(spec.template, entry)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise UserFacingError(f"task.datasets.{spec.name}.template {spec.template!r} does not fit its entries "
                                  f"({exc.__class__.__name__}: {exc}; fields: question, metadata "
                                  f"{sorted(entry.get('metadata', {}))})") from None
        if not text.strip():
            raise UserFacingError(f"task.datasets.{spec.name}.template gives an empty prompt")
    return ds


def universe_fp(specs: list[DatasetSpec], seed: int) -> str:
    """8 hex digits naming the universe: dataset names, configs, templates and seed (not the weights: the mix)."""
    blob = json.dumps(sorted([s.name, s.config, s.template] for s in specs) + [seed], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def _render(template: str, entry: dict) -> str:
    """A prompt from an entry: {question} and {metadata[key]} (the answer is not offered)."""
    return template.format(question=entry["question"], metadata=entry.get("metadata", {}))


def _hash_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


class ReasoningGymTask(Task):
    """A weighted mixture of reasoning-gym datasets with their own `score_answer` rewards."""

    splits = ("id",)

    def __init__(self, datasets: Any, seed: int = BASE_SEED, form: str = "bare", mix: Any = None) -> None:
        self.specs = sorted(parse_datasets(datasets), key=lambda s: s.name)  # the order a user lists them is no identity
        self.seed = seed
        self.form = check_form(form)  # task.prompt_form: bare question, few-shot prefix or chat instruction
        self.fp = universe_fp(self.specs, seed)
        self.task_id = task_id_for(f"reasoning-gym-{self.fp}", form)
        self.parts = tuple(s.name for s in self.specs)
        self._templates = {s.name: s.template for s in self.specs}
        self._ds = {s.name: _make_dataset(s, seed) for s in self.specs}
        weights = {s.name: s.weight for s in self.specs}
        self.mix = parse_mix(weights if mix is None else mix, self.parts, weights,
                             "task.datasets weights" if mix is None else "task.mix")
        self._weights = np.array([self.mix[s.name] for s in self.specs])
        self._entries: OrderedDict[str, dict] = OrderedDict()
        self._shots: dict[str, list[tuple[str, str]]] = {}

    # --- problems -------------------------------------------------------------------------------
    def _entry(self, name: str, i: int) -> dict:
        key = f"{name}:{i}"
        entry = self._entries.get(key)
        if entry is None:
            entry = self._ds[name][i]
            self._entries[key] = entry
            if len(self._entries) > _CACHE:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        return entry

    def _question(self, name: str, entry: dict) -> str:
        template = self._templates[name]
        return entry["question"] if template is None else _render(template, entry)

    def _prompt(self, name: str, i: int, entry: dict) -> Prompt:
        text = question_text(self.form, self._question(name, entry), self._fewshot(name))
        return Prompt(id=f"rg:{self.fp}:{name}:{i}", text=text, answer=entry["answer"])

    def _fewshot(self, name: str) -> list[tuple[str, str]]:
        """The dataset's first SHOTS training problems with their answers (never held-out ones), for "fewshot"."""
        if self.form != "fewshot":
            return []
        if name not in self._shots:
            shots, i = [], 0
            while len(shots) < SHOTS:
                entry = self._ds[name][i]
                if not self._held_out(name, entry):
                    shots.append((self._question(name, entry), entry["answer"]))
                i += 1
            self._shots[name] = shots
        return self._shots[name]

    def _held_out(self, name: str, entry: dict) -> bool:
        return _hash_int(f"{name}\0{entry['question']}") % EVAL_MODULUS == 0

    def part_of(self, prompt: Prompt) -> str:
        """The dataset a prompt comes from: reasoning-gym's parts (eval reports accuracy per dataset)."""
        return prompt.id.split(":")[2]

    dataset_of = part_of

    def train_prompts(self, n: int, rng: np.random.Generator) -> list[Prompt]:
        """n distinct training problems; each picks its dataset by weight, then a non-held-out index."""
        out: list[Prompt] = []
        seen: set[str] = set()
        names = [s.name for s in self.specs]
        tries = 0
        while len(out) < n:
            tries += 1
            name = names[int(rng.choice(len(names), p=self._weights))]
            i = int(rng.integers(0, SIZE))
            entry = self._entry(name, i)
            if self._held_out(name, entry):
                continue
            if entry["question"] in seen and tries < 100 * max(n, 1):  # small datasets may repeat problems
                continue
            seen.add(entry["question"])
            out.append(self._prompt(name, i, entry))
        return out

    def eval_prompts(self, split: str, n: int) -> list[Prompt]:
        """First n held-out problems, the datasets taking turns (so every prefix covers all of them)."""
        if split != "id":
            raise ValueError(f"unknown split {split!r}; expected one of {self.splits}")
        per = {s.name: self._held_out_prefix(s.name, -(-max(n, 0) // len(self.specs))) for s in self.specs}
        out: list[Prompt] = []
        k = 0
        while len(out) < n and any(k < len(v) for v in per.values()):
            for s in self.specs:
                if k < len(per[s.name]) and len(out) < n:
                    out.append(per[s.name][k])
            k += 1
        return out

    def _held_out_prefix(self, name: str, n: int) -> list[Prompt]:
        out: list[Prompt] = []
        seen: set[str] = set()
        i = 0
        while len(out) < n and i < min(SIZE, 20 * EVAL_MODULUS * max(n, 1)):  # small datasets run out
            entry = self._ds[name][i]
            if self._held_out(name, entry) and entry["question"] not in seen:
                seen.add(entry["question"])
                out.append(self._prompt(name, i, entry))
            i += 1
        return out

    # --- rewards and ids ------------------------------------------------------------------------
    def _entry_for(self, prompt: Prompt) -> dict | None:
        m = _ID_RE.fullmatch(prompt.id)
        if m is None or m.group(1) != self.fp or m.group(2) not in self._ds:
            return None
        return self._entry(m.group(2), int(m.group(3)))

    def reward(self, prompt: Prompt, completion: str) -> float:
        """The dataset's own score_answer on the stripped completion, clipped to [0, 1]; the fewshot and chat
        forms score the answer line only (tasks/answers.py), so made-up follow-ups cost nothing."""
        entry = self._entry_for(prompt)
        if entry is None:
            return 0.0
        name = prompt.id.split(":")[2]
        try:
            text = completion.strip() if self.form == "bare" else first_line_answer(completion)
            r = float(self._ds[name].score_answer(text[:MAX_ANSWER_CHARS], entry))
        except Exception:  # a scorer that chokes on odd text: that text is simply wrong
            return 0.0
        return min(1.0, max(0.0, r)) if np.isfinite(r) else 0.0

    def prompt_from_id(self, prompt_id: str) -> Prompt | None:
        """Rebuild a training prompt; None for junk, another task spec, unknown datasets or held-out problems."""
        if not isinstance(prompt_id, str) or len(prompt_id) > MAX_ID_LEN:
            return None
        m = _ID_RE.fullmatch(prompt_id)
        if m is None or m.group(1) != self.fp or m.group(2) not in self._ds:
            return None
        name, i = m.group(2), int(m.group(3))
        if i >= SIZE:
            return None
        try:
            entry = self._entry(name, i)
        except Exception:
            return None
        if self._held_out(name, entry):
            return None
        return self._prompt(name, i, entry)
