"""Your own task without a fork: files with named fields, a reward by import path, a plugin entry point."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from swarm_node.config import TaskConfig
from swarm_node.errors import UserFacingError
from swarm_node.tasks import get_task
from swarm_node.tasks.base import Task
from swarm_node.tasks.files import FilesTask

ROWS = [{"q": f"{i}*2=", "a": str(2 * i)} for i in range(40)]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(path: Path, **kw) -> TaskConfig:
    return TaskConfig(name="files", data_path=str(path), prompt_field="q", answer_field="a", **kw)


def test_jsonl_with_named_fields(tmp_path):
    task = get_task(_cfg(_jsonl(tmp_path / "d.jsonl", ROWS)))
    ev = task.eval_prompts("id", 100)
    assert [p.text for p in ev] == [r["q"] for r in ROWS[36:]]  # the last 10% is held out
    train = task.train_prompts(30, np.random.default_rng(0))
    assert not {p.text for p in train} & {p.text for p in ev}
    p = train[0]
    assert task.prompt_from_id(p.id) == p and task.prompt_from_id(ev[0].id) is None
    assert task.reward(p, " " + p.answer + "\n") == 1.0 and task.reward(p, p.answer + "0") == 0.0


def test_parquet_and_datasets_directory(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"q": [r["q"] for r in ROWS], "a": [int(r["a"]) for r in ROWS]}), tmp_path / "d.parquet")
    t1 = get_task(_cfg(tmp_path / "d.parquet"))
    assert t1.eval_prompts("id", 1)[0].answer == ROWS[36]["a"]  # numeric columns become text
    split = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:30]),
                                  "test": datasets.Dataset.from_list(ROWS[30:])})
    split.save_to_disk(str(tmp_path / "hf"))
    t2 = get_task(_cfg(tmp_path / "hf"))
    assert [p.text for p in t2.eval_prompts("id", 100)] == [r["q"] for r in ROWS[30:]]  # its own test split
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "flat"))
    t3 = get_task(_cfg(tmp_path / "flat"))
    assert len(t3.eval_prompts("id", 100)) == 4
    assert len({t1.task_id, t2.task_id, t3.task_id}) == 3


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""
        def close(completion, answer):
            try:
                return max(0.0, 1.0 - abs(int(completion) - int(answer)) / 10)
            except ValueError:
                return 0.0

        def three(completion, answer, extra):
            return 1.0

        def boom(completion, answer):
            raise RuntimeError("no")

        def big(completion, answer):
            return 7.0

        def text(completion, answer):
            return "yes"

        not_callable = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_reward_by_import_path(tmp_path, reward_module):
    task = get_task(_cfg(_jsonl(tmp_path / "d.jsonl", ROWS), reward="my_rewards:close"))
    p = task.train_prompts(1, np.random.default_rng(0))[0]
    assert task.reward(p, p.answer) == 1.0
    assert task.reward(p, str(int(p.answer) + 3)) == pytest.approx(0.7)
    assert task.reward(p, "garbage") == 0.0


@pytest.mark.parametrize("spec, pattern", [
    ("my_rewards", "must be 'module:function'"),
    ("my_rewards:", "must be 'module:function'"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("my_rewards:missing", "has no function 'missing'"),
    ("my_rewards:not_callable", "has no function 'not_callable'"),
    ("my_rewards:three", r"must accept \(completion, answer\)"),
    ("my_rewards:boom", "raised on the first record"),
    ("my_rewards:big", r"must return a number in \[0, 1\]"),
    ("my_rewards:text", r"must return a number in \[0, 1\]"),
])
def test_bad_reward_functions_fail_at_start(tmp_path, reward_module, spec, pattern):
    with pytest.raises(UserFacingError, match=pattern) as info:
        get_task(_cfg(_jsonl(tmp_path / "d.jsonl", ROWS), reward=spec))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name, content, pattern", [
    ("a.jsonl", '{"q": "1=", "a": "1"}\n{"q": "2="}\n', "line 2: missing field 'a'"),
    ("b.jsonl", '{"q": "1=", "a": "1"}\nnot json\n', "line 2: invalid JSON"),
    ("c.jsonl", '{"q": "1=", "a": ["1"]}\n{"q": "2=", "a": "2"}\n', "field 'a' must be a string"),
    ("d.jsonl", '{"q": "  ", "a": "1"}\n{"q": "2=", "a": "2"}\n', "field 'q' is empty"),
    ("e.jsonl", '["q", "a"]\n', "expected an object"),
    ("f.jsonl", '{"q": "1=", "a": "1"}\n', "only 1 record"),
    ("g.jsonl", "\n\n", "no records"),
    ("h.csv", "q,a\n1=,1\n", "unsupported extension '.csv'"),
    ("i.parquet", "not parquet", "not a readable parquet file"),
])
def test_malformed_files_are_one_line_errors(tmp_path, name, content, pattern):
    (tmp_path / name).write_text(content)
    with pytest.raises(UserFacingError, match=pattern) as info:
        get_task(_cfg(tmp_path / name))
    assert "\n" not in str(info.value)


def test_missing_inputs(tmp_path):
    with pytest.raises(UserFacingError, match="data file not found"):
        get_task(_cfg(tmp_path / "nope.jsonl"))
    with pytest.raises(UserFacingError, match="task.data_path is required"):
        get_task(TaskConfig(name="files"))
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(UserFacingError, match="not a Hugging Face datasets directory"):
        get_task(_cfg(tmp_path / "empty_dir"))
    with pytest.raises(UserFacingError, match=r"line 1: missing field 'answer' \(fields: q, a\)"):
        get_task(TaskConfig(name="files", data_path=str(_jsonl(tmp_path / "x.jsonl", ROWS)), prompt_field="q"))


@pytest.fixture
def plugin_dist(tmp_path, monkeypatch):
    """A real installed distribution (dist-info with entry_points.txt) on sys.path: what `pip install` leaves."""
    (tmp_path / "my_task_plugin.py").write_text(textwrap.dedent("""
        from swarm_node.tasks.files import FilesTask

        def make(cfg):
            return FilesTask(cfg.data_path, prompt_field="q", answer_field="a")

        def broken(cfg):
            raise KeyError("oops")

        def wrong(cfg):
            return object()
    """))
    info = tmp_path / "my_task_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-task-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[swarm_node.tasks]\nmy_task = my_task_plugin:make\nbroken_task = my_task_plugin:broken\n"
        "wrong_task = my_task_plugin:wrong\nmissing_task = my_task_plugin:nothing_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_task_plugin", None)


def test_task_plugin_entry_point(tmp_path, plugin_dist):
    data = _jsonl(tmp_path / "d.jsonl", ROWS)
    task = get_task(TaskConfig(name="my_task", data_path=str(data)))
    assert isinstance(task, Task) and isinstance(task, FilesTask)
    with pytest.raises(UserFacingError, match="failed to build its task: KeyError") as e1:
        get_task(TaskConfig(name="broken_task", data_path=str(data)))
    with pytest.raises(UserFacingError, match="returned object, not a swarm_node Task"):
        get_task(TaskConfig(name="wrong_task"))
    with pytest.raises(UserFacingError, match="failed to load") as e2:
        get_task(TaskConfig(name="missing_task"))
    with pytest.raises(UserFacingError, match="my_task") as e3:  # the error lists what is installed
        get_task(TaskConfig(name="not_installed"))
    assert all("\n" not in str(e.value) for e in (e1, e2, e3))
