"""The round loop both modes share (node/loop.py): round numbers, checkpoint cadence, resume, stop, exit code.

A node that trains a 2x2 linear layer stands in for GRPO and DPO (the real loops run in test_learning.py,
test_dpo_resume.py, test_faults.py); checkpoints, metrics.jsonl and the signal handling are the real ones.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swarm_node.config import NodeConfig
from swarm_node.node import loop
from swarm_node.node.checkpoint import CheckpointWriteError, list_checkpoints
from swarm_node.node.metrics import MetricsWriter, read_metrics
from swarm_node.node.rows import GRPORow
from tests.test_checkpoint import CORRUPTIONS, corrupt


class Trainer:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict:
        return {"steps": 1}

    def load_state_dict(self, state: dict) -> None:
        pass


class LinearNode(loop.RoundNode):
    """Each round adds 1 to every weight; evaluates when asked; can raise SIGTERM inside a round."""

    MODE = "test"

    def __init__(self, cfg: NodeConfig, state_dir: Path, first_round: int, on_stop_eval: bool,
                 signal_in_round: int | None = None) -> None:
        self.FIRST_ROUND, self.EVALUATES_ON_STOP = first_round, on_stop_eval
        self.cfg, self.state_dir = cfg, state_dir
        model = torch.nn.Linear(2, 2, bias=False)
        torch.nn.init.zeros_(model.weight)
        self.loaded = SimpleNamespace(model=model, name="linear")
        self.trainer = Trainer(model)
        self.metrics = MetricsWriter(state_dir)
        self.signal_in_round = signal_in_round
        self._start_rounds()

    def run_round(self, evaluate=None) -> GRPORow:
        r = self.last_round + 1
        if r == self.signal_in_round:
            os.kill(os.getpid(), signal.SIGTERM)
        with torch.no_grad():
            self.loaded.model.weight += 1
        evaluated = evaluate() if evaluate is not None else self.eval_due(r)
        self.last_round = r
        return GRPORow(round=r, eval_accuracy=float(self.loaded.model.weight[0, 0].detach()) if evaluated else None)


def _cfg(rounds: int | None) -> NodeConfig:
    return NodeConfig.model_validate({"rounds": rounds, "swarm": {"enabled": False}, "metrics": {"eval_every": 3},
                                      "checkpoint": {"every_rounds": 2, "keep": 10}})


@pytest.mark.parametrize("first_round", [1, 0])
def test_one_round_counter_for_both_numberings(tmp_path, first_round):
    """`rounds: 5` trains 5 rounds; rows, checkpoints and the resumed counter carry the same round numbers."""
    assert loop.run_node(lambda: LinearNode(_cfg(5), tmp_path, first_round, False)) == 0
    labels = [first_round + i for i in range(5)]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["round"] for r in rows] == labels
    # every 2 rounds done, and the last one on exit
    assert [c.round for c in list_checkpoints(tmp_path)] == [labels[1], labels[3], labels[4]]
    evaluated = [r["round"] for r in rows if r["eval_accuracy"] is not None]
    assert evaluated == [x for x in labels if x % 3 == 0 or x == labels[-1]]

    node = LinearNode(_cfg(7), tmp_path, first_round, False)
    node.resume()
    assert node.last_round == labels[-1] and node.rounds_done == 5 and not node.finished()
    assert float(node.loaded.model.weight[0, 0].detach()) == 5.0  # the weights of the last round
    assert loop.run_node(lambda: LinearNode(_cfg(7), tmp_path, first_round, False)) == 0
    assert [r["round"] for r in read_metrics(tmp_path / "metrics.jsonl")] == labels + [labels[-1] + 1, labels[-1] + 2]


@pytest.mark.parametrize("on_stop_eval", [True, False])
def test_a_signal_inside_a_round_finishes_it_checkpoints_and_exits_0(tmp_path, on_stop_eval):
    handler_before = signal.getsignal(signal.SIGTERM)
    assert loop.run_node(lambda: LinearNode(_cfg(None), tmp_path, 1, on_stop_eval, signal_in_round=2)) == 0
    assert signal.getsignal(signal.SIGTERM) is handler_before
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2]
    # modes that evaluate on stop end with an evaluated row; the others evaluate only when due
    assert (rows[-1]["eval_accuracy"] is not None) is on_stop_eval
    assert [c.round for c in list_checkpoints(tmp_path)] == [2]


def test_a_failed_final_checkpoint_is_exit_code_1(tmp_path, monkeypatch, capsys):
    def full_disk(*_a, **_k):
        raise CheckpointWriteError("writing checkpoint failed: [Errno 28] No space left on device")

    monkeypatch.setattr(loop, "save_checkpoint", full_disk)
    nodes = []

    def make() -> LinearNode:
        nodes.append(LinearNode(_cfg(3), tmp_path, 1, False))
        return nodes[0]

    assert loop.run_node(make) == 1
    assert nodes[0].checkpoint_failures == 2  # after round 2 (cadence) and on exit
    assert [r["round"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]  # kept training
    assert "exiting without a checkpoint of round 3" in capsys.readouterr().err  # (run_node sets up logging)


def _keep_cfg(rounds: int, keep: int, every: int = 1) -> NodeConfig:
    return NodeConfig.model_validate({"rounds": rounds, "swarm": {"enabled": False}, "metrics": {"eval_every": 3},
                                      "checkpoint": {"every_rounds": every, "keep": keep}})


@pytest.mark.parametrize("first_every", [1, 1000])
@pytest.mark.parametrize("keep", [1, 2])
@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_after_an_unreadable_checkpoint_a_restart_resumes_from_the_newest_readable_and_loses_no_later_round(
        tmp_path, keep, kind, first_every, capsys):
    """Kill-and-corrupt: 4 rounds, the newest checkpoint made unreadable, a restart, then another.

    The first run checkpoints every round (`first_every` 1: ckpt-3 is readable with keep 2) or only on exit
    (1000: ckpt-4 is the only one). The first restart resumes from the newest readable checkpoint, or from
    the model as loaded at round 1 (never with the bad checkpoint's weights), sets the bad one aside in one
    log line, and trains to round 7 (past the bad round) or 3 (short of it); the second restart must continue
    right after that, so no round trained after the first restart was lost.
    LinearNode's weight is the number of rounds it was trained, so it shows which weights were restored.
    """
    assert loop.run_node(lambda: LinearNode(_keep_cfg(4, keep, first_every), tmp_path, 1, False)) == 0
    corrupt(tmp_path / "ckpt-00000004", kind)
    capsys.readouterr()
    nodes = []

    def make(rounds: int):
        def new() -> LinearNode:
            nodes.append(LinearNode(_keep_cfg(rounds, keep), tmp_path, 1, False))
            return nodes[-1]
        return new

    falls_back = keep == 2 and first_every == 1
    second = 7 if first_every == 1 else 3
    assert loop.run_node(make(second)) == 0
    err = capsys.readouterr().err
    assert err.count("set aside as ckpt-00000004.unreadable") == 1, err
    assert ("ckpt-00000003: continuing at round 4" if falls_back else "starting at round 0") in err, err
    assert float(nodes[-1].loaded.model.weight[0, 0].detach()) == second  # not the bad checkpoint's weights + more
    assert (tmp_path / "ckpt-00000004.unreadable").is_dir()
    assert [c.round for c in list_checkpoints(tmp_path)] == ([second] if keep == 1 else [second - 1, second])

    assert loop.run_node(make(second + 2)) == 0
    assert f"continuing at round {second + 1}" in capsys.readouterr().err
    assert float(nodes[-1].loaded.model.weight[0, 0].detach()) == second + 2
    assert [r["round"] for r in read_metrics(tmp_path / "metrics.jsonl")] == list(range(1, second + 3))


@pytest.mark.slow
def test_both_modes_follow_one_lr_curve(presets_dir, tmp_path):
    """GRPO (rounds from 1) and DPO (rounds from 0) with the same base lr and schedule train their k-th round at
    the same learning rate: the one the loop's `round_lr` gives, set on the optimizer the round steps with."""
    from swarm_node.config import load_config
    from swarm_node.dpo.round import DPONode
    from swarm_node.grpo.round import GRPONode
    from swarm_node.models.factory import Preset, build_model, build_tokenizer

    torch.set_num_threads(1)
    schedule = ["rounds=4", "training.lr_schedule=linear", "training.warmup_rounds=2", "metrics.eval_every=100"]
    tok = build_tokenizer()
    pre = Preset("llama", hidden=32, layers=2, heads=2, kv_heads=2, intermediate=64, lr_full=1e-3, lr_lora=1e-3)
    build_model(pre, len(tok), tok.pad_token_id, tok.eos_token_id, 0).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    grpo = GRPONode(load_config(None, [*schedule, "training.lr=0.001", "task.prompts_per_round=2",
                                       "generation.num_generations=2", "task.eval_n=4"]), tmp_path / "grpo")
    dpo = DPONode(load_config(None, [*schedule, "mode=dpo", f"model.path={tmp_path / 'model'}", "dpo.lr=0.001",
                                     "dpo.pairs_per_user=16", "dpo.heldout_pairs=16"]), tmp_path / "dpo")
    curves = {}
    try:
        for node in (grpo, dpo):
            curves[node.MODE] = []
            for _ in range(4):
                expected = node.round_lr()
                row = node.run_round()
                assert node.trainer.optimizer.param_groups[0]["lr"] == pytest.approx(expected) == row["lr"]
                curves[node.MODE].append(row["lr"])
    finally:
        grpo.close()
        dpo.close()
    assert curves["GRPO"] == pytest.approx([0.0005, 0.001, 0.001, 0.0005])
    assert curves["DPO"] == pytest.approx(curves["GRPO"])
