"""Optional experiment trackers (`metrics.report_to`): TensorBoard and Weights & Biases.

Each metrics.jsonl row is logged as scalars at step = round, under the same field names; a nested dict
(`rejected`, `external_groups_by_peer`) becomes `field/key`. Text and list fields stay in metrics.jsonl.

Some nested keys are chosen by peers (a peer's model name in `external_groups_by_peer`), so a series name
is sanitised (letters, digits, `_ - . :`, at most MAX_NAME_CHARS) and each field gets at most
MAX_NAMES_PER_FIELD names over a run: later ones are summed under `field/other`. A swarm of Sybils cannot
grow a run's series, or write `/`-nested panels, without bound.
"""

from __future__ import annotations

import importlib.util
import math
import re
import uuid
from pathlib import Path
from typing import Any

from swarm_node.errors import UserFacingError

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
MAX_NAMES_PER_FIELD = 32  # series per nested field of a row over a run; the rest go to `<field>/other`
MAX_NAME_CHARS = 80  # a peer id (52) and a short model name
OTHER = "other"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def check_installed(report_to: list[str]) -> None:
    """Fail before the model loads when a requested tracker's library is missing."""
    for name in report_to:
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise UserFacingError(f"metrics.report_to includes {name!r} but the {PACKAGES[name]} package is not "
                                  "installed; pip install 'swarm-node[trackers]', or remove it from metrics.report_to")


def series_name(key: object) -> str:
    """A key as a series name: unsafe characters replaced by `_`, cut to MAX_NAME_CHARS."""
    return _UNSAFE.sub("_", str(key))[:MAX_NAME_CHARS] or "_"


class SeriesNames:
    """The names each nested field has been given over a run: the first MAX_NAMES_PER_FIELD, then `other`."""

    def __init__(self, max_names: int = MAX_NAMES_PER_FIELD) -> None:
        self.max_names = max_names
        self._names: dict[str, set[str]] = {}  # field (ours, a fixed set) -> its admitted names

    def name(self, field: str, key: object) -> str:
        names = self._names.setdefault(field, set())
        name = series_name(key)
        if name in names or name == OTHER:
            return name
        if len(names) < self.max_names:
            names.add(name)
            return name
        return OTHER


def scalars(row: dict, names: SeriesNames | None = None) -> dict[str, float]:
    """The numeric fields of a row (bools as 0/1; nested dicts as `field/key`, named by `names`, whose bound
    holds across the rows it sees); null and NaN are left out. Values of keys that share a name are summed."""
    names = names or SeriesNames()
    out: dict[str, float] = {}

    def number(v: Any) -> float | None:
        if isinstance(v, bool):
            return float(v)
        if isinstance(v, int | float) and math.isfinite(v):
            return float(v)
        return None

    for key, value in row.items():
        field = series_name(key)
        if isinstance(value, dict):
            for sub, v in value.items():
                x = number(v)
                if x is not None:
                    tag = f"{field}/{names.name(field, sub)}"
                    out[tag] = out.get(tag, 0.0) + x
        elif (x := number(value)) is not None:
            out[field] = x
    return out


class TensorBoardTracker:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.names = SeriesNames()

    def log(self, row: dict, step: int) -> None:
        for key, value in scalars(row, self.names).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # one row per round: cheap, and a killed node loses nothing

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """One W&B run per state dir; its id is kept in STATE_DIR/wandb_run_id so a restart continues it."""

    def __init__(self, state_dir: Path, project: str, name: str, config: dict | None) -> None:
        import wandb

        id_file = Path(state_dir) / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        self.run = wandb.init(project=project, name=name, id=run_id, resume="allow", dir=str(state_dir),
                              config=config or {})
        self.names = SeriesNames()

    def log(self, row: dict, step: int) -> None:
        self.run.log(scalars(row, self.names), step=step)

    def close(self) -> None:
        self.run.finish()


def make_trackers(report_to: list[str], state_dir: Path, *, node_name: str, tensorboard_dir: str | None = None,
                  wandb_project: str = "swarm-node", config: dict | None = None) -> list:
    check_installed(report_to)
    out: list = []
    for name in dict.fromkeys(report_to):
        if name == "tensorboard":
            out.append(TensorBoardTracker(Path(tensorboard_dir) if tensorboard_dir else Path(state_dir) / "tensorboard"))
        elif name == "wandb":
            out.append(WandbTracker(Path(state_dir), wandb_project, node_name, config))
    return out
