"""Your own prompts and answers: JSONL or parquet files, or a local Hugging Face `datasets` directory.

Each record has a prompt field and an answer field (names set by task.prompt_field / task.answer_field).
The reward is exact match of the stripped completion by default, or a function named by import path,
`module:function`, called as `fn(completion, answer)` and returning a number in [0, 1]. The function is
imported and tried once on the first record at start, so a typo or a bad signature fails before training.

The task id carries a fingerprint of the data and the settings, so nodes with other data decline each
other; prompt ids are "files:<fp8>:<row>". The held-out set is task.eval_data_path or the last 10% of rows.

With `task.part_field`, each record names its part (a subject, a skill); the node's mix (`task.mix`) weights
the parts it samples and the eval reports each part. Neither is in the task id: peers with the same data and
other mixes (or another part field) share a swarm.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from swarm_node.errors import UserFacingError
from swarm_node.tasks.base import Prompt, Task
from swarm_node.tasks.mix import parse_mix

MAX_ID_LEN = 64
MAX_FIELD_CHARS = 16_384
MAX_PARTS = 64  # eval reports every part in every metrics row: a part field is a category, not an id


# --- reading records --------------------------------------------------------------------------------
def _check(path: Path, where: str, record: Any, fields: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(record, dict):
        raise UserFacingError(f"{path}: {where}: expected an object with {fields[0]!r} and {fields[1]!r}, "
                              f"got {type(record).__name__}")
    out = []
    for key in fields:
        if key not in record or record[key] is None:
            raise UserFacingError(f"{path}: {where}: missing field {key!r} (fields: {', '.join(map(str, record))})")
        value = record[key]
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)  # numeric answers are common in parquet / datasets columns
        if not isinstance(value, str):
            raise UserFacingError(f"{path}: {where}: field {key!r} must be a string, got {type(value).__name__}")
        if not value.strip():
            raise UserFacingError(f"{path}: {where}: field {key!r} is empty")
        if len(value) > MAX_FIELD_CHARS:
            raise UserFacingError(f"{path}: {where}: field {key!r} is longer than {MAX_FIELD_CHARS} characters")
        out.append(value)
    return tuple(out)


def _jsonl(path: Path, fields: tuple[str, ...]) -> list[tuple[str, ...]]:
    rows = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UserFacingError(f"{path}: line {lineno}: not valid UTF-8 text") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserFacingError(f"{path}: line {lineno}: invalid JSON ({exc.msg})") from None
            rows.append(_check(path, f"line {lineno}", record, fields))
    return rows


def _table_rows(path: Path, columns: list[str], get: Callable[[str], list], fields: tuple[str, ...]):
    for key in fields:
        if key not in columns:
            raise UserFacingError(f"{path}: missing field {key!r} (columns: {', '.join(columns)})")
    cols = [get(f) for f in fields]
    return [_check(path, f"row {i + 1}", dict(zip(fields, values, strict=True)), fields)
            for i, values in enumerate(zip(*cols, strict=True))]


def _parquet(path: Path, fields: tuple[str, ...]) -> list[tuple[str, ...]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise UserFacingError(f"{path}: not a readable parquet file ({exc.__class__.__name__})") from None
    return _table_rows(path, table.column_names, lambda c: table.column(c).to_pylist(), fields)


def _hf_dir(path: Path, fields: tuple[str, ...], split: str) -> list[tuple[str, ...]]:
    try:
        import datasets
    except ImportError:
        raise UserFacingError(f"{path}: reading a datasets directory needs the 'datasets' package") from None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise UserFacingError(f"{path}: not a Hugging Face datasets directory written by save_to_disk "
                              f"({exc.__class__.__name__})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise UserFacingError(f"{path}: no split {split!r} (splits: {', '.join(ds)})")
        ds = ds[split]
    return _table_rows(path, list(ds.column_names), lambda c: ds[c], fields)


def read_records(path: str | Path, fields: tuple[str, ...], split: str = "train") -> list[tuple[str, ...]]:
    """The `fields` of each record, e.g. (prompt, answer), of a .jsonl / .parquet file or a datasets directory
    (its `split` if it has splits)."""
    p = Path(path).expanduser()
    if p.is_dir():
        rows = _hf_dir(p, fields, split)
    elif not p.is_file():
        raise UserFacingError(f"{p}: data file not found")
    elif p.suffix.lower() in (".jsonl", ".ndjson"):
        rows = _jsonl(p, fields)
    elif p.suffix.lower() in (".parquet", ".pq"):
        rows = _parquet(p, fields)
    else:
        raise UserFacingError(f"{p}: unsupported extension {p.suffix!r}; use .jsonl, .parquet or a datasets directory")
    if not rows:
        raise UserFacingError(f"{p}: no records")
    return rows


def _fingerprint(path: Path) -> str:
    h = hashlib.sha256()
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


# --- rewards ------------------------------------------------------------------------------------------
def exact_match(completion: str, answer: str) -> float:
    return 1.0 if completion.strip() == answer.strip() else 0.0


def load_reward(spec: str, example: tuple[str, str]) -> Callable[[str, str], float]:
    """Import `module:function`, check it takes (completion, answer), and try it once on a record."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise UserFacingError(f"task.reward must be 'module:function', got {spec!r}")
    mod_name, fn_name = spec.split(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:
        raise UserFacingError(f"task.reward: cannot import module {mod_name!r} ({exc.__class__.__name__}: {exc})") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise UserFacingError(f"task.reward: module {mod_name!r} has no function {fn_name!r}")
    try:
        inspect.signature(fn).bind("completion", "answer")
    except (TypeError, ValueError):
        raise UserFacingError(f"task.reward: {spec} must accept (completion, answer)") from None
    try:
        value = fn(example[1], example[1])
    except Exception as exc:
        raise UserFacingError(f"task.reward: {spec} raised on the first record ({exc.__class__.__name__}: {exc})") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 1:
        raise UserFacingError(f"task.reward: {spec} must return a number in [0, 1], returned {value!r}")
    return fn


# --- the task -------------------------------------------------------------------------------------------
class FilesTask(Task):
    """Prompts and answers from the user's files, rewarded by exact match or the user's function."""

    splits = ("id",)

    def __init__(self, data_path: str | Path, *, eval_data_path: str | Path | None = None,
                 prompt_field: str = "prompt", answer_field: str = "answer", reward: str | None = None,
                 eval_fraction: float = 0.1, part_field: str | None = None, mix: Any = None) -> None:
        fields = (prompt_field, answer_field)
        read = fields + ((part_field,) if part_field else ())
        self.data_path = Path(data_path).expanduser()
        rows = read_records(self.data_path, read, "train")
        if eval_data_path is not None:
            eval_rows = read_records(eval_data_path, read, "train")
            self._n_train = len(rows)
        elif self.data_path.is_dir() and _has_split(self.data_path, "test"):
            eval_rows = read_records(self.data_path, read, "test")
            self._n_train = len(rows)
        else:
            if len(rows) < 2:
                raise UserFacingError(f"{self.data_path}: only {len(rows)} record; need 2 to hold out an eval "
                                      "slice, or set task.eval_data_path")
            n_eval = min(len(rows) - 1, max(1, round(len(rows) * eval_fraction)))
            self._n_train = len(rows) - n_eval
            eval_rows = rows[self._n_train:]
            rows = rows[: self._n_train]
        held = {r[0] for r in eval_rows}
        self._rows = [r for r in rows if r[0] not in held]  # an eval prompt never trains, even if repeated
        if not self._rows:
            raise UserFacingError(f"{self.data_path}: every training prompt is also in the eval data")
        self._n_train = len(self._rows)
        self._eval = eval_rows
        self.reward_fn = load_reward(reward, self._rows[0]) if reward else exact_match
        # the universe: the data, the fields that make a prompt and its answer, the reward, the eval data
        blob = json.dumps([_fingerprint(self.data_path), fields, reward, str(eval_data_path or "")])
        self.fp = hashlib.sha256(blob.encode()).hexdigest()[:8]
        self.task_id = f"files-{self.fp}"
        self._set_parts(part_field, mix)

    def _set_parts(self, part_field: str | None, mix: Any) -> None:
        """Parts from the part field's values; the mix weights them (default: each part as often as its rows)."""
        self._by_part: dict[str, np.ndarray] = {}
        if part_field is None:
            if mix is not None:
                raise UserFacingError("task.mix needs task.part_field for the files task (the record field that "
                                      "names each record's part)")
            return
        values = sorted({r[2] for r in self._rows} | {r[2] for r in self._eval})
        if len(values) > MAX_PARTS:
            raise UserFacingError(f"task.part_field {part_field!r} has {len(values)} distinct values; at most "
                                  f"{MAX_PARTS} parts (a category such as a subject, not an id)")
        self.parts = tuple(values)
        column = np.array([r[2] for r in self._rows], dtype=object)
        self._by_part = {v: np.flatnonzero(column == v) for v in values}
        default = {v: float(len(ix)) for v, ix in self._by_part.items()}
        self.mix = parse_mix(mix, self.parts, default)
        for v, ix in self._by_part.items():
            if self.mix[v] > 0 and ix.size == 0:
                raise UserFacingError(f"task.mix.{v}: part {v!r} has eval records only, nothing to train on")

    def _prompt(self, kind: str, i: int, row: tuple[str, ...]) -> Prompt:
        return Prompt(id=f"files:{self.fp}:{kind}{i}", text=row[0], answer=row[1])

    def train_prompts(self, n: int, rng: np.random.Generator) -> list[Prompt]:
        """n rows, distinct when there are enough; with parts, each part's share of them by the mix."""
        if not self._by_part:
            idx = rng.choice(self._n_train, size=n, replace=n > self._n_train)
        else:
            names = list(self.parts)
            counts = np.bincount(rng.choice(len(names), size=n, p=[self.mix[v] for v in names]),
                                 minlength=len(names))
            idx = np.concatenate([rng.choice(self._by_part[v], size=c, replace=c > self._by_part[v].size)
                                  for v, c in zip(names, counts, strict=True) if c])
        return [self._prompt("", int(i), self._rows[int(i)]) for i in idx]

    def part_of(self, prompt: Prompt) -> str | None:
        """The record's part field (None without one, or for an id that is not ours)."""
        if not self._by_part:
            return None
        digits = prompt.id.rsplit(":", 1)[-1]
        rows, digits = (self._eval, digits[1:]) if digits.startswith("e") else (self._rows, digits)
        return rows[int(digits)][2] if digits.isdigit() and int(digits) < len(rows) else None

    def eval_prompts(self, split: str, n: int) -> list[Prompt]:
        if split != "id":
            raise ValueError(f"unknown split {split!r}; expected one of {self.splits}")
        return [self._prompt("e", i, r) for i, r in enumerate(self._eval[: max(n, 0)])]

    def reward(self, prompt: Prompt, completion: str) -> float:
        try:
            r = float(self.reward_fn(completion, prompt.answer))
        except Exception:  # the user's function failing on odd text scores that text 0
            return 0.0
        return min(1.0, max(0.0, r)) if math.isfinite(r) else 0.0

    def prompt_from_id(self, prompt_id: str) -> Prompt | None:
        if not isinstance(prompt_id, str) or len(prompt_id) > MAX_ID_LEN:
            return None
        parts = prompt_id.split(":")
        if len(parts) != 3 or parts[0] != "files" or parts[1] != self.fp:
            return None
        digits = parts[2]  # eval ids ("e<i>") never rebuild: held-out rows stay out of training
        if not digits.isascii() or not digits.isdigit() or (len(digits) > 1 and digits[0] == "0"):
            return None
        i = int(digits)
        return self._prompt("", i, self._rows[i]) if i < self._n_train else None


def _has_split(path: Path, split: str) -> bool:
    info = path / "dataset_dict.json"
    if not info.is_file():
        return False
    try:
        return split in json.loads(info.read_text()).get("splits", [])
    except ValueError:
        return False
