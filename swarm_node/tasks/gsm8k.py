"""GSM8K-style word problems read from a local JSONL or parquet file, rewarded by answer checking.

Rows have `question` and `answer` fields; the gold answer is the text after the last "####" in
`answer` (GSM8K convention), with thousands separators removed ("1,234" -> "1234").

The model is asked to put its final answer inside <answer>...</answer> (see INSTRUCTION). Reward:
  * 1.0            exactly one well-formed <answer>X</answer> and X equals the gold answer
                   (plain numbers compared exactly after removing "$" and commas, so "18.0" == "18";
                   anything else is checked by math-verify);
  * format_reward  (default 0.1) exactly one well-formed tag pair with non-empty content, wrong answer;
  * 0.0            no tag, several tags, an unclosed tag, empty content or content over the length bound.

The task id carries a fingerprint of the training file's bytes, so nodes with different data decline
each other; prompt ids are "gsm8k:<fp8>:<row index>".
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path

import numpy as np

from swarm_node.errors import UserFacingError
from swarm_node.tasks.base import Prompt, Task

INSTRUCTION = "Put the final answer inside <answer></answer>."
OPEN, CLOSE = "<answer>", "</answer>"
MAX_ANSWER_CHARS = 64  # math-verify can be slow on long or odd inputs; real answers are short
MAX_ID_LEN = 64
VERIFY_TIMEOUT_S = 2
_NUMBER_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
_THOUSANDS_RE = re.compile(r"(?<=[0-9]),(?=[0-9]{3}(?![0-9]))")


@dataclass(frozen=True)
class Row:
    question: str
    gold: str


# --- data files ---------------------------------------------------------------------------------
def _fail(path: Path, where: str, what: str) -> UserFacingError:
    return UserFacingError(f"{path}: {where}: {what}")


def fingerprint(path: Path) -> str:
    """sha256 of the file's bytes (streamed, so large files are fine)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gold_from_solution(answer: str) -> str | None:
    """The final answer after the last '####', commas removed; None if there is none."""
    if "####" not in answer:
        return None
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    return final or None


def _row(path: Path, where: str, record: object) -> Row:
    if not isinstance(record, dict):
        raise _fail(
            path, where, f"expected an object with 'question' and 'answer', got {type(record).__name__}"
        )
    for key in ("question", "answer"):
        if key not in record or record[key] is None:
            raise _fail(path, where, f"missing field '{key}'")
        if not isinstance(record[key], str):
            raise _fail(path, where, f"field '{key}' must be a string, got {type(record[key]).__name__}")
    if not record["question"].strip():
        raise _fail(path, where, "field 'question' is empty")
    gold = gold_from_solution(record["answer"])
    if gold is None:
        raise _fail(
            path, where, "field 'answer' has no final answer after '####' (GSM8K convention: '... #### 42')"
        )
    if len(gold) > MAX_ANSWER_CHARS:
        raise _fail(path, where, f"final answer is longer than {MAX_ANSWER_CHARS} characters")
    return Row(question=record["question"].strip(), gold=gold)


def _read_jsonl(path: Path) -> list[Row]:
    rows: list[Row] = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _fail(path, f"line {lineno}", "not valid UTF-8 text") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _fail(path, f"line {lineno}", f"invalid JSON ({exc.msg})") from None
            rows.append(_row(path, f"line {lineno}", record))
    return rows


def _read_parquet(path: Path) -> list[Row]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise UserFacingError(f"{path}: not a readable parquet file ({exc})") from None
    for key in ("question", "answer"):
        if key not in table.column_names:
            raise _fail(path, "row 1", f"missing field '{key}' (columns: {', '.join(table.column_names)})")
    questions = table.column("question").to_pylist()
    answers = table.column("answer").to_pylist()
    return [
        _row(path, f"row {i + 1}", {"question": q, "answer": a})
        for i, (q, a) in enumerate(zip(questions, answers, strict=True))
    ]


def load_rows(path: str | Path) -> list[Row]:
    """Read a GSM8K-format file; a problem raises UserFacingError naming the file, line/row and issue."""
    p = Path(path)
    if not p.is_file():
        raise UserFacingError(f"{p}: data file not found")
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        rows = _read_jsonl(p)
    elif suffix in (".parquet", ".pq"):
        rows = _read_parquet(p)
    else:
        raise UserFacingError(f"{p}: unsupported extension '{p.suffix}'; use .jsonl or .parquet")
    if not rows:
        raise UserFacingError(f"{p}: empty file: no rows with 'question' and 'answer'")
    return rows


# --- answer checking ----------------------------------------------------------------------------
def extract_answer(completion: str) -> str | None:
    """Content of the single <answer>...</answer>; None if the completion is malformed."""
    if completion.count(OPEN) != 1 or completion.count(CLOSE) != 1:
        return None
    start = completion.index(OPEN) + len(OPEN)
    end = completion.find(CLOSE, start)
    if end < 0:
        return None  # the close tag comes before the open tag
    content = completion[start:end].strip()
    if not content or len(content) > MAX_ANSWER_CHARS:
        return None
    return content


def normalize(text: str) -> str:
    """Drop what people write around a number: '$', '\\$', thousands separators, a trailing '.'."""
    s = text.strip().replace("\\$", "").replace("$", "").strip()
    s = _THOUSANDS_RE.sub("", s)
    return s[:-1] if s.endswith(".") else s


def _as_number(text: str) -> Decimal | None:
    if not _NUMBER_RE.fullmatch(text):
        return None
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


@lru_cache(maxsize=8192)
def _parse(text: str, timeout: int | None) -> tuple:
    from math_verify import parse

    try:
        return tuple(parse(text, parsing_timeout=timeout))
    except Exception:  # math-verify is an external parser; any failure means "no answer"
        return ()


def answers_match(pred: str, gold: str) -> bool:
    """Whether a predicted answer equals the gold one (numbers exactly, else via math-verify)."""
    p, g = normalize(pred), normalize(gold)
    if len(p) > MAX_ANSWER_CHARS or not p:
        return False
    pn, gn = _as_number(p), _as_number(g)
    if pn is not None and gn is not None:
        return pn == gn
    # math-verify's timeouts use signal.alarm, which only works on the main thread; elsewhere the length
    # bound above is the guard.
    timeout = VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    from math_verify import verify

    gp, pp = _parse(g, timeout), _parse(p, timeout)
    if not gp or not pp:
        return False
    try:
        return bool(verify(list(gp), list(pp), timeout_seconds=timeout))
    except Exception:
        return False


# --- the task -----------------------------------------------------------------------------------
class GSM8KTask(Task):
    """Word problems with a format + correctness reward."""

    splits = ("id",)

    def __init__(
        self,
        data_path: str | Path,
        eval_data_path: str | Path | None = None,
        eval_fraction: float = 0.1,
        format_reward: float = 0.1,
    ) -> None:
        self.data_path = Path(data_path)
        rows = load_rows(self.data_path)
        self.fp = fingerprint(self.data_path)[:8]
        self.task_id = f"gsm8k-{self.fp}"
        self.format_reward = float(format_reward)
        self._rows = rows
        if eval_data_path is not None:
            self.eval_path: Path | None = Path(eval_data_path)
            self._eval_rows = load_rows(self.eval_path)
            self._eval_fp = fingerprint(self.eval_path)[:8]
            if self._eval_fp == self.fp:
                raise UserFacingError(
                    f"{self.eval_path}: same contents as {self.data_path}; eval data must be held out"
                )
            self._n_train = len(rows)
        else:
            if len(rows) < 2:
                raise UserFacingError(
                    f"{self.data_path}: only {len(rows)} row; need at least 2 to hold out an eval slice, "
                    "or set task.eval_data_path"
                )
            self.eval_path = None
            n_eval = min(len(rows) - 1, max(1, round(len(rows) * eval_fraction)))
            self._n_train = len(rows) - n_eval  # the last n_eval rows are held out
            self._eval_rows = rows[self._n_train :]
            self._eval_fp = self.fp

    def _prompt(self, fp: str, index: int, row: Row) -> Prompt:
        return Prompt(id=f"gsm8k:{fp}:{index}", text=f"{row.question}\n{INSTRUCTION}", answer=row.gold)

    def train_prompts(self, n: int, rng: np.random.Generator) -> list[Prompt]:
        """n training rows, distinct when the file has enough rows."""
        idx = rng.choice(self._n_train, size=n, replace=n > self._n_train)
        return [self._prompt(self.fp, int(i), self._rows[int(i)]) for i in idx]

    def eval_prompts(self, split: str, n: int) -> list[Prompt]:
        """First n held-out rows in file order."""
        if split != "id":
            raise ValueError(f"unknown split {split!r}; expected one of {self.splits}")
        offset = 0 if self.eval_path is not None else self._n_train
        rows = self._eval_rows[: max(n, 0)]
        return [self._prompt(self._eval_fp, offset + i, r) for i, r in enumerate(rows)]

    def reward(self, prompt: Prompt, completion: str) -> float:
        content = extract_answer(completion)
        if content is None:
            return 0.0
        return 1.0 if answers_match(content, prompt.answer) else self.format_reward

    def prompt_from_id(self, prompt_id: str) -> Prompt | None:
        """Rebuild a training prompt; None for junk, other data, or held-out (eval) rows."""
        if not isinstance(prompt_id, str) or len(prompt_id) > MAX_ID_LEN:
            return None
        parts = prompt_id.split(":")
        if len(parts) != 3 or parts[0] != "gsm8k" or parts[1] != self.fp:
            return None
        digits = parts[2]
        if not digits.isascii() or not digits.isdigit() or (len(digits) > 1 and digits[0] == "0"):
            return None
        i = int(digits)
        if i >= self._n_train:
            return None  # held-out rows never enter training, even via a peer
        return self._prompt(self.fp, i, self._rows[i])
