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

    return ArithmeticTask(seed=cfg.seed, form=cfg.prompt_form, max_operand=cfg.max_operand, mix=cfg.mix)


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
    return ReasoningGymTask(cfg.datasets, form=cfg.prompt_form, mix=cfg.mix)


def _files(cfg: TaskConfig) -> Task:
    from swarm_node.tasks.files import FilesTask

    if not cfg.data_path:
        raise UserFacingError("task.data_path is required when task.name is 'files' "
                              "(a .jsonl or .parquet file, or a datasets directory)")
    return FilesTask(cfg.data_path, eval_data_path=cfg.eval_data_path, prompt_field=cfg.prompt_field,
                     answer_field=cfg.answer_field, reward=cfg.reward, part_field=cfg.part_field, mix=cfg.mix)


# Name -> factory. Imports are lazy so a node only loads what its task needs.
TASKS: dict[str, Callable[[TaskConfig], Task]] = {
    "arithmetic": _arithmetic, "gsm8k": _gsm8k, "reasoning_gym": _reasoning_gym, "files": _files,
}


# Tasks that pose their problems in task.prompt_form (tasks/prompt_forms.py); the others take prompts as given.
FORMED_TASKS = frozenset({"arithmetic", "reasoning_gym"})


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


def check_mix(cfg: TaskConfig) -> None:
    """The mix's one-line error before anything slow loads (arithmetic and reasoning-gym parts are known from
    the config alone; a files task's parts come from its data and are checked when it is built)."""
    if cfg.mix is None:
        return
    from swarm_node.tasks.mix import parse_mix

    if cfg.name == "arithmetic":
        from swarm_node.tasks.arithmetic import DEFAULT_MIX, PARTS

        parse_mix(cfg.mix, PARTS, DEFAULT_MIX)
    elif cfg.name == "reasoning_gym" and cfg.datasets is not None:
        from swarm_node.tasks.reasoning_gym import parse_datasets

        names = tuple(s.name for s in parse_datasets(cfg.datasets))
        parse_mix(cfg.mix, names, {})


def get_task(cfg: TaskConfig) -> Task:
    """Build the task named by `cfg.name` (built in or a plugin); its eval split must be one the task has."""
    if cfg.prompt_form != "bare" and cfg.name not in FORMED_TASKS:
        raise UserFacingError(f"task.prompt_form {cfg.prompt_form!r} is offered by {sorted(FORMED_TASKS)}; task "
                              f"{cfg.name!r} poses its prompts as its data gives them (use prompt_form: bare)")
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
    if cfg.mix is not None and not task.parts:
        raise UserFacingError(f"task.mix is set, but task {cfg.name!r} has no parts to weight (the mix weights "
                              "arithmetic's add/sub/signed, reasoning-gym datasets, or a files task's part_field)")
    if cfg.part_field is not None and cfg.name != "files":
        raise UserFacingError(f"task.part_field applies to the files task only, not {cfg.name!r}")
    if cfg.eval_split not in task.splits:
        raise UserFacingError(
            f"task.eval_split {cfg.eval_split!r} is not available for task {cfg.name!r}; "
            f"expected one of {list(task.splits)}"
        )
    return task
