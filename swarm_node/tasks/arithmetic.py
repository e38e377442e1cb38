"""Two-operand integer arithmetic: a task tiny character-level models can learn in minutes.

Prompts are a few characters ("12+7=") so a small model can attend to the whole problem; the model
should emit just the answer ("19") and then EOS.

The universe (task id "arithmetic-v2"): a, b in 0..99 with + or -, written plainly ("12+7=") or with a
leading sign ("+12+7="). Its three parts, which a node's mix (`task.mix`) weights:
  * "add"    - "a+b="
  * "sub"    - "a-b="
  * "signed" - "+a+b=" / "+a-b=": the leading-sign format (weight 0 by default, so a node alone never sees
               it and the "ood" split below stays out of distribution; a peer that samples it may share it)
The default mix (add 1, sub 1, signed 0) draws exactly the prompts of the v1 universe, seed for seed.

Splits:
  * "id"  - a, b in 0..99 with + or - (answers may be negative, e.g. "3-15=" -> "-12").
            About 10% of these problems are held out for evaluation, chosen by a hash of the problem,
            so every node holds out the same ones without coordination; training never sees them.
  * "ood" - the held-out id problems with an explicit plus sign on the first operand, "+12-7=": a
            notation neither the warm-up nor training ever shows (every training prompt starts with a
            digit; here every character sits one position later). The i-th ood problem is "+" and the
            i-th id eval problem, so neither the problem nor the notation was ever trained on. Both
            presets start between 5% and 40% here (docs/results/learning.md), so in- and out-of-distribution
            gains can both be measured; prompt_from_id refuses every ood id.
  * "ood_formats" - the previous ood split, kept so older figures can be reproduced: spaced
            "12 + 7 =" and chained "3+8-5=" problems in equal turns (tiny-m starts at 0.138, tiny-s at
            0.01: below the 5% floor).
  * "ood3"  - a, b in 100..999 (3-digit operands): every model scores ~0 here, kept for comparison.
  * "union" - every part's held-out problems, the parts taking turns (add, sub, signed): the i-th add / sub
            problem is the i-th of that operator in the id order, the i-th signed one the i-th ood problem.

Prompt forms (`task.prompt_form`, tasks/prompt_forms.py): "bare" poses a problem as built ("12+7="), the
fewshot and chat forms wrap the same problem for a real model; `task.max_operand` narrows the operands of the
id and signed parts (and their held-out problems) to 0..max_operand. Both are part of the task id; the mix
is not.

Prompt ids are self-describing ("arith:id:12+7", "arith:signed:12+7"), so any node rebuilds the prompt and
answer from the id alone. Ids of held-out problems are refused by `prompt_from_id`, so a peer's sample cannot leak an
eval problem into training.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache, cached_property

import numpy as np

from swarm_node.tasks.answers import integer_reward
from swarm_node.tasks.base import Prompt, Task
from swarm_node.tasks.mix import parse_mix
from swarm_node.tasks.prompt_forms import arithmetic_text, check_form, task_id_for

ID_RANGE = (0, 99)
OOD_RANGE = (100, 999)
OPS = ("+", "-")
PARTS = ("add", "sub", "signed")
DEFAULT_MIX = {"add": 1.0, "sub": 1.0, "signed": 0.0}  # the v1 universe's training distribution
EVAL_MODULUS = 10  # one "id" problem in EVAL_MODULUS is held out
MAX_ID_LEN = 32  # ids come from the network: anything longer is junk
_ID_RE = re.compile(r"arith:(id|signed|ood|ood3):(0|[1-9][0-9]{0,2})([+-])(0|[1-9][0-9]{0,2})")  # canonical only


def _hash_int(text: str) -> int:
    """Platform-independent hash (Python's hash() is salted per process, so nodes would disagree)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _solve(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def _is_held_out(a: int, op: str, b: int) -> bool:
    """Whether an in-distribution problem belongs to the eval set (same answer on every node)."""
    return _hash_int(f"{a}{op}{b}") % EVAL_MODULUS == 0


@cache
def _num_train_problems(op: str | None = None, hi: int = ID_RANGE[1]) -> int:
    """Training problems (not held out) of one operator, or of both, with operands 0..hi."""
    lo = ID_RANGE[0]
    ops = OPS if op is None else (op,)
    return sum(not _is_held_out(a, o, b) for a in range(lo, hi + 1) for o in ops for b in range(lo, hi + 1))


def _make(split: str, a: int, op: str, b: int) -> Prompt:
    """A problem of one part: "id" ids are plain ("12+7="), "signed" ids carry a leading sign ("+12+7=")."""
    sign = "+" if split == "signed" else ""
    return Prompt(id=f"arith:{split}:{a}{op}{b}", text=f"{sign}{a}{op}{b}=", answer=str(_solve(a, op, b)))


def _part_problems(part: str, hi: int = ID_RANGE[1]) -> int:
    return _num_train_problems("+" if part == "add" else "-" if part == "sub" else None, hi)


class ArithmeticTask(Task):
    """a+b / a-b with a binary exact-match reward."""

    task_id = "arithmetic-v2"  # v1 had no signed part: its nodes could not rebuild "arith:signed:" ids
    splits = ("id", "ood", "ood_formats", "ood3", "union")
    parts = PARTS

    def __init__(self, seed: int = 0, form: str = "bare", max_operand: int = ID_RANGE[1],
                 mix: dict | None = None) -> None:
        self.seed = seed  # default stream for sft_examples when no rng is given
        self.form = check_form(form)  # task.prompt_form (tasks/prompt_forms.py); the warm-up data stays bare
        if not 9 <= max_operand <= ID_RANGE[1]:
            raise ValueError(f"max_operand must be in 9..{ID_RANGE[1]}, got {max_operand}")
        self.hi = int(max_operand)  # task.max_operand: operands 0..hi (a smaller model's easier "id" split)
        base = task_id_for(ArithmeticTask.task_id, form)
        self.task_id = base if self.hi == ID_RANGE[1] else f"{base}.max{self.hi}"
        self.mix = parse_mix(mix, PARTS, DEFAULT_MIX)
        self._default_mix = self.mix == parse_mix(None, PARTS, DEFAULT_MIX)
        self._mix_p = np.array([self.mix[p] for p in PARTS])

    def _pose(self, p: Prompt) -> Prompt:
        """A problem as this task's prompt form puts it ("bare": as built, "12+7=")."""
        if self.form == "bare":
            return p
        return Prompt(id=p.id, text=arithmetic_text(self.form, p.text.rstrip("= ")), answer=p.answer)

    # --- training -------------------------------------------------------------------------------
    def _sample_train(self, rng: np.random.Generator, taken: set | None = None) -> tuple[int, str, int]:
        """A plain training problem, a and b uniform, the operator uniform: the default mix's (and v1's) draw."""
        lo, hi = ID_RANGE[0], self.hi
        while True:  # rejection: ~10% of draws hit a held-out problem, a few more repeat one already taken
            a, b = (int(x) for x in rng.integers(lo, hi + 1, size=2))
            op = OPS[int(rng.integers(0, len(OPS)))]
            if not _is_held_out(a, op, b) and (taken is None or ("id", a, op, b) not in taken):
                return a, op, b

    def _sample_part(self, rng: np.random.Generator, taken: set | None) -> tuple[str, int, str, int]:
        """(split, a, op, b) of another mix: the part by weight, then a and b uniform (and the operator, for signed)."""
        lo, hi = ID_RANGE[0], self.hi
        while True:
            part = PARTS[int(rng.choice(len(PARTS), p=self._mix_p))]
            a, b = (int(x) for x in rng.integers(lo, hi + 1, size=2))
            op = "+" if part == "add" else "-" if part == "sub" else OPS[int(rng.integers(0, len(OPS)))]
            split = "signed" if part == "signed" else "id"
            if not _is_held_out(a, op, b) and (taken is None or (split, a, op, b) not in taken):
                return split, a, op, b

    def _num_mix_problems(self) -> int:
        return sum(_part_problems(p, self.hi) for p in PARTS if self.mix[p] > 0)

    def train_prompts(self, n: int, rng: np.random.Generator) -> list[Prompt]:
        """n distinct prompts of this node's mix, each uniform within its part, never a held-out problem.

        Distinct because a round's groups are keyed by prompt id on the wire (peers decline a repeat).
        Past the mix's training problems (~18,000 for the default), repeats are allowed.
        """
        taken: set = set()
        out = []
        limit = self._num_mix_problems()
        for _ in range(n):
            pool = taken if len(taken) < limit else None
            problem = ("id", *self._sample_train(rng, pool)) if self._default_mix else self._sample_part(rng, pool)
            taken.add(problem)
            out.append(self._pose(_make(*problem)))
        return out

    def part_of(self, prompt: Prompt) -> str | None:
        """add / sub (plain problems, eval and training), signed (leading sign: "signed" and "ood" ids); else None."""
        kind, _, rest = prompt.id[len("arith:"):].partition(":")
        if kind == "id":
            return "add" if "+" in rest else "sub"
        if kind in ("signed", "ood"):
            return "signed"
        return None

    def sft_examples(self, n: int, rng: np.random.Generator | None = None) -> list[tuple[str, str]]:
        """(prompt text, target) pairs for supervised warm-up; the caller appends EOS to the target."""
        rng = rng if rng is not None else np.random.default_rng(self.seed)
        return [(p.text, p.answer) for p in self.iid_prompts(n, rng)]

    def iid_prompts(self, n: int, rng: np.random.Generator) -> list[Prompt]:
        """n training prompts drawn i.i.d. (repeats possible): the warm-up's data and validation set.

        The tiny presets are built from this stream; changing it changes their weights (bump FACTORY_VERSION).
        """
        return [_make("id", *self._sample_train(rng)) for _ in range(n)]

    # --- evaluation -----------------------------------------------------------------------------
    @cached_property
    def _id_eval(self) -> list[Prompt]:
        """All held-out problems, in a fixed order (by hash) so any prefix is a spread-out sample."""
        lo, hi = ID_RANGE[0], self.hi
        probs = [(a, op, b) for a in range(lo, hi + 1) for op in OPS for b in range(lo, hi + 1)]
        held = [p for p in probs if _is_held_out(*p)]
        held.sort(key=lambda p: _hash_int(f"order:{p[0]}{p[1]}{p[2]}"))
        return [_make("id", *p) for p in held]

    def _ood_signed(self, n: int) -> list[Prompt]:
        """The i-th id eval problem with a leading "+": same order, so any prefix is the same on every node."""
        return [Prompt(id=f"arith:ood:{i}", text="+" + p.text, answer=p.answer)
                for i, p in enumerate(self._id_eval[: max(n, 0)])]

    def _ood_formats(self, n: int) -> list[Prompt]:
        """Spaced and chained problems take turns; the i-th of each is a pure function of i."""
        def spaced(h: int) -> tuple[str, int]:
            a, b, op = h % 100, (h // 100) % 100, OPS[(h // 10_000) % 2]
            return f"{a} {op} {b} =", _solve(a, op, b)

        def chained(h: int) -> tuple[str, int]:
            a, b, c = h % 10, (h // 10) % 10, (h // 100) % 10
            op1, op2 = OPS[(h // 1000) % 2], OPS[(h // 2000) % 2]
            return f"{a}{op1}{b}{op2}{c}=", _solve(_solve(a, op1, b), op2, c)

        streams = []
        for kind, make, want in (("s", spaced, (n + 1) // 2), ("c", chained, n // 2)):
            got: dict[str, int] = {}
            i = 0
            while len(got) < want and i < 100 * max(want, 1):
                text, ans = make(_hash_int(f"ood-{kind}:{i}"))
                got.setdefault(text, ans)
                i += 1
            streams.append(list(got.items()))
        out = []
        for k in range(max(len(streams[0]), len(streams[1]))):
            for s in streams:
                if k < len(s) and len(out) < n:
                    out.append(Prompt(id=f"arith:ood_formats:{len(out)}", text=s[k][0], answer=str(s[k][1])))
        return out

    def _ood_eval(self, n: int) -> list[Prompt]:
        """The i-th 3-digit problem is a pure function of i, so every prefix is the same on every node."""
        lo, hi = OOD_RANGE
        span = hi - lo + 1
        out: list[Prompt] = []
        seen: set[str] = set()
        i = 0
        while len(out) < n and i < 100 * max(n, 1):
            h = _hash_int(f"ood:{i}")
            a, b, op = lo + h % span, lo + (h // span) % span, OPS[(h // span // span) % len(OPS)]
            p = _make("ood3", a, op, b)
            if p.id not in seen:
                seen.add(p.id)
                out.append(p)
            i += 1
        return out

    def _union_eval(self, n: int) -> list[Prompt]:
        """Every part's held-out problems in turns (add, sub, signed): the same prefix on every node."""
        k = -(-max(n, 0) // len(PARTS))
        add = [p for p in self._id_eval if "+" in p.id][:k]
        sub = [p for p in self._id_eval if "-" in p.id][:k]
        turns = [add, sub, self._ood_signed(k)]
        return [part[i] for i in range(k) for part in turns if i < len(part)][: max(n, 0)]

    def eval_prompts(self, split: str, n: int) -> list[Prompt]:
        """First n prompts of the split's fixed order (fewer if the split is smaller), in the task's form."""
        return [self._pose(p) for p in self._eval_bare(split, n)]

    def _eval_bare(self, split: str, n: int) -> list[Prompt]:
        if split == "id":
            return self._id_eval[: max(n, 0)]
        if split == "union":
            return self._union_eval(n)
        if split == "ood":
            return self._ood_signed(n)
        if split == "ood_formats":
            return self._ood_formats(max(n, 0))
        if split == "ood3":
            return self._ood_eval(max(n, 0))
        raise ValueError(f"unknown split {split!r}; expected one of {self.splits}")

    # --- rewards and ids ------------------------------------------------------------------------
    def reward(self, prompt: Prompt, completion: str) -> float:
        """1.0 if the completion (stripped of surrounding whitespace) is exactly the answer, else 0.0; the
        fewshot and chat forms compare the answer line's final integer instead (tasks/answers.py).

        Binary on purpose: partial credit for "close" numbers would reward guessing magnitudes.
        """
        if self.form != "bare":
            return integer_reward(completion, prompt.answer)
        return 1.0 if completion.strip() == prompt.answer else 0.0

    def prompt_from_id(self, prompt_id: str) -> Prompt | None:
        """Rebuild a training prompt; None for junk, foreign, out-of-range or held-out (eval) ids."""
        if not isinstance(prompt_id, str) or len(prompt_id) > MAX_ID_LEN:
            return None
        m = _ID_RE.fullmatch(prompt_id)
        if m is None:
            return None
        split, a, op, b = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
        lo, hi = OOD_RANGE if split == "ood3" else (ID_RANGE[0], self.hi)
        if not (lo <= a <= hi and lo <= b <= hi):
            return None
        if split not in ("id", "signed") or _is_held_out(a, op, b):
            return None  # eval problems never enter training, even via a peer (nor in the signed format)
        return self._pose(_make(split, a, op, b))

    def is_held_out(self, prompt_id: str) -> bool:
        """Whether a well-formed id names an eval problem (useful to count refused peer samples)."""
        m = (
            _ID_RE.fullmatch(prompt_id)
            if isinstance(prompt_id, str) and len(prompt_id) <= MAX_ID_LEN
            else None
        )
        if m is None:
            return isinstance(prompt_id, str) and re.fullmatch(r"arith:(ood|ood_formats):(0|[1-9][0-9]{0,5})", prompt_id) is not None
        return m.group(1) not in ("id", "signed") or _is_held_out(int(m.group(2)), m.group(3), int(m.group(4)))
