"""Tasks: prompt streams with locally computed rewards. `get_task` builds the one a config names.

Built in: arithmetic, gsm8k, reasoning_gym, files (your own JSONL / parquet / datasets directory). Any
other name is looked up among installed plugins: an entry point in the group `swarm_node.tasks` whose
object is a callable `factory(cfg: TaskConfig) -> Task` (a Task subclass taking the config works too).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from swarm_node.config import TaskConfig
from swarm_node.errors import UserFacingError
from swarm_node.tasks.base import Prompt, Task

__all__ = ["ENTRY_POINT_GROUP", "Prompt", "Task", "TASKS", "get_task"]

ENTRY_POINT_GROUP = "swarm_node.tasks"


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


def _reasoning_gym(cfg: TaskConfig) -> Task:
    from swarm_node.tasks.reasoning_gym import ReasoningGymTask

    if cfg.datasets is None:
        raise UserFacingError("task.datasets is required when task.name is 'reasoning_gym' (e.g. [chain_sum])")
    return ReasoningGymTask(cfg.datasets)


def _files(cfg: TaskConfig) -> Task:
    from swarm_node.tasks.files import FilesTask

    if not cfg.data_path:
        raise UserFacingError("task.data_path is required when task.name is 'files' "
                              "(a .jsonl or .parquet file, or a datasets directory)")
    return FilesTask(cfg.data_path, eval_data_path=cfg.eval_data_path, prompt_field=cfg.prompt_field,
                     answer_field=cfg.answer_field, reward=cfg.reward)


# Name -> factory. Imports are lazy so a node only loads what its task needs.
TASKS: dict[str, Callable[[TaskConfig], Task]] = {
    "arithmetic": _arithmetic, "gsm8k": _gsm8k, "reasoning_gym": _reasoning_gym, "files": _files,
}


def _plugin(name: str) -> Callable[[TaskConfig], Task] | None:
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        return None
    try:
        return found[0].load()
    except Exception as exc:
        raise UserFacingError(f"task plugin {name!r} ({found[0].value}) failed to load: "
                              f"{exc.__class__.__name__}: {exc}") from None


def available_tasks() -> list[str]:
    return sorted(set(TASKS) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def get_task(cfg: TaskConfig) -> Task:
    """Build the task named by `cfg.name` (built in or a plugin); its eval split must be one the task has."""
    factory = TASKS.get(cfg.name) or _plugin(cfg.name)
    if factory is None:
        raise UserFacingError(f"unknown task.name {cfg.name!r}; expected one of {available_tasks()} "
                              f"(plugins register an entry point in the group {ENTRY_POINT_GROUP!r})")
    if cfg.name not in TASKS:
        try:
            task = factory(cfg)
        except UserFacingError:
            raise
        except Exception as exc:
            raise UserFacingError(f"task plugin {cfg.name!r} failed to build its task: "
                                  f"{exc.__class__.__name__}: {exc}") from None
        if not isinstance(task, Task):
            raise UserFacingError(f"task plugin {cfg.name!r} returned {type(task).__name__}, not a swarm_node Task")
    else:
        task = factory(cfg)
    if cfg.eval_split not in task.splits:
        raise UserFacingError(
            f"task.eval_split {cfg.eval_split!r} is not available for task {cfg.name!r}; "
            f"expected one of {list(task.splits)}"
        )
    return task
