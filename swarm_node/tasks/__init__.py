"""Tasks: prompt streams with locally computed rewards. `get_task` builds the one a config names."""

from __future__ import annotations

from collections.abc import Callable

from swarm_node.config import TaskConfig
from swarm_node.errors import UserFacingError
from swarm_node.tasks.base import Prompt, Task

__all__ = ["Prompt", "Task", "TASKS", "get_task"]


def _arithmetic(cfg: TaskConfig) -> Task:
    from swarm_node.tasks.arithmetic import ArithmeticTask

    return ArithmeticTask(seed=cfg.seed)


def _gsm8k(cfg: TaskConfig) -> Task:
    from swarm_node.tasks.gsm8k import GSM8KTask

    if not cfg.data_path:
        raise UserFacingError(
            "task.data_path is required when task.name is 'gsm8k' (a .jsonl or .parquet file)"
        )
    return GSM8KTask(cfg.data_path, eval_data_path=cfg.eval_data_path)


# Name -> factory. Imports are lazy so a node only loads what its task needs.
TASKS: dict[str, Callable[[TaskConfig], Task]] = {"arithmetic": _arithmetic, "gsm8k": _gsm8k}


def get_task(cfg: TaskConfig) -> Task:
    """Build the task named by `cfg.name`; its eval split must be one the task has."""
    try:
        factory = TASKS[cfg.name]
    except KeyError:
        raise UserFacingError(f"unknown task.name {cfg.name!r}; expected one of {sorted(TASKS)}") from None
    task = factory(cfg)
    if cfg.eval_split not in task.splits:
        raise UserFacingError(
            f"task.eval_split {cfg.eval_split!r} is not available for task {cfg.name!r}; "
            f"expected one of {list(task.splits)}"
        )
    return task
