"""Optional experiment trackers (`metrics.report_to`): TensorBoard and Weights & Biases.

Each metrics.jsonl row is logged as scalars at step = round, under the same field names; a nested dict
(`rejected`, `external_groups_by_peer`) becomes `field/key`. Text and list fields stay in metrics.jsonl.
"""

from __future__ import annotations

import importlib.util
import math
import uuid
from pathlib import Path
from typing import Any

from swarm_node.errors import UserFacingError

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def check_installed(report_to: list[str]) -> None:
    """Fail before the model loads when a requested tracker's library is missing."""
    for name in report_to:
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise UserFacingError(f"metrics.report_to includes {name!r} but the {PACKAGES[name]} package is not "
                                  "installed; pip install 'swarm-node[trackers]', or remove it from metrics.report_to")


def scalars(row: dict) -> dict[str, float]:
    """The numeric fields of a row (bools as 0/1; nested dicts as `field/key`); null and NaN are left out."""
    out: dict[str, float] = {}

    def put(key: str, v: Any) -> None:
        if isinstance(v, bool):
            out[key] = float(v)
        elif isinstance(v, int | float) and math.isfinite(v):
            out[key] = float(v)

    for key, value in row.items():
        if isinstance(value, dict):
            for sub, v in value.items():
                put(f"{key}/{sub}", v)
        else:
            put(key, value)
    return out


class TensorBoardTracker:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, row: dict, step: int) -> None:
        for key, value in scalars(row).items():
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

    def log(self, row: dict, step: int) -> None:
        self.run.log(scalars(row), step=step)

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
