"""DPO checkpoint/resume in one process: a run stopped and restarted ends bit-identical to one that never stopped.

The node trains alone (no swarm) so that the only thing under test is the state a checkpoint carries:
parameters, the optimizer, the batch sampler's RNG and torch's RNG, and the metrics rows kept once each.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from swarm_node.config import load_config
from swarm_node.dpo import round as dpo_round
from swarm_node.dpo.round import DPONode, run_dpo_node


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from swarm_node.models.factory import Preset, build_model, build_tokenizer

    out = tmp_path_factory.mktemp("dpo-resume-model")
    tok = build_tokenizer()
    pre = Preset("llama", hidden=32, layers=2, heads=2, kv_heads=2, intermediate=64, lr_full=1e-3, lr_lora=1e-3)
    build_model(pre, len(tok), tok.pad_token_id, tok.eos_token_id, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _cfg(model_dir: Path, rounds: int | None, *extra: str):
    return load_config(None, ["mode=dpo", f"model.path={model_dir}", "dpo.user=1", "dpo.lr=0.003",
                              "dpo.pairs_per_user=32", "dpo.heldout_pairs=32", "dpo.local_steps=2",
                              "checkpoint.every_rounds=1", "metrics.eval_every=1",
                              *([f"rounds={rounds}"] if rounds is not None else []), *extra])


def _rows(state: Path) -> list[dict]:
    return [json.loads(line) for line in (state / "metrics.jsonl").read_text().splitlines()]


def _optimizer_tensors(node: DPONode) -> list[torch.Tensor]:
    state = node.trainer.optimizer.state_dict()["state"]
    return [t for k in sorted(state) for _, t in sorted(state[k].items()) if isinstance(t, torch.Tensor)]


def _resumed_node(model_dir: Path, state: Path, rounds: int) -> DPONode:
    node = DPONode(_cfg(model_dir, rounds), state)
    node.resume()
    return node


def test_stop_and_resume_is_bit_identical_to_an_uninterrupted_run(model_dir: Path, tmp_path: Path) -> None:
    assert run_dpo_node(_cfg(model_dir, 5), tmp_path / "straight", log_level="warning") == 0
    assert run_dpo_node(_cfg(model_dir, 2), tmp_path / "split", log_level="warning") == 0
    assert [r["round"] for r in _rows(tmp_path / "split")] == [0, 1]
    assert run_dpo_node(_cfg(model_dir, 5), tmp_path / "split", log_level="warning") == 0

    straight, split = _rows(tmp_path / "straight"), _rows(tmp_path / "split")
    assert [r["round"] for r in split] == [0, 1, 2, 3, 4]  # each round once, the resumed ones appended
    # same parameters after every round, the resumed rounds included, and the same local losses
    assert [r["params_digest"] for r in split] == [r["params_digest"] for r in straight]
    assert [r["dpo_loss"] for r in split] == [r["dpo_loss"] for r in straight]
    # a restarted node holds the same optimizer state as the one that never stopped
    a, b = _resumed_node(model_dir, tmp_path / "straight", 5), _resumed_node(model_dir, tmp_path / "split", 5)
    assert a.last_round == b.last_round == 4  # five rounds done, numbered from 0
    ta, tb = _optimizer_tensors(a), _optimizer_tensors(b)
    assert ta and len(ta) == len(tb) and all(torch.equal(x, y) for x, y in zip(ta, tb, strict=True))
    assert a.trainer.rng.bit_generator.state == b.trainer.rng.bit_generator.state


def test_resume_without_the_sampler_state_would_diverge(model_dir: Path, tmp_path: Path) -> None:
    """The test above can fail: a resume that restored weights and optimizer but not the batch sampler differs."""
    assert run_dpo_node(_cfg(model_dir, 4), tmp_path / "straight", log_level="warning") == 0
    assert run_dpo_node(_cfg(model_dir, 2), tmp_path / "split", log_level="warning") == 0
    node = DPONode(_cfg(model_dir, 4), tmp_path / "split")
    node.resume()
    node.trainer.rng = type(node.trainer.rng)(type(node.trainer.rng.bit_generator)(0))  # a fresh sampler
    for _ in range(2):
        row = node.run_round(evaluate=lambda: False)
    assert row["params_digest"] != _rows(tmp_path / "straight")[-1]["params_digest"]


def test_sigterm_mid_round_then_restart_continues_at_the_next_round(model_dir: Path, tmp_path: Path,
                                                                    monkeypatch) -> None:
    state = tmp_path / "state"
    real_round = DPONode.run_round

    def signalling(self, *args, **kwargs):
        if self.last_round + 1 == 1:  # while round 1 runs
            os.kill(os.getpid(), signal.SIGTERM)
        return real_round(self, *args, **kwargs)

    monkeypatch.setattr(dpo_round.DPONode, "run_round", signalling)
    assert run_dpo_node(_cfg(model_dir, None), state, log_level="warning") == 0
    assert [r["round"] for r in _rows(state)] == [0, 1]
    monkeypatch.setattr(dpo_round.DPONode, "run_round", real_round)
    node = _resumed_node(model_dir, state, 4)
    assert node.last_round == 1  # continues at round 2
    from swarm_node.dpo.vectors import get_params, params_digest

    assert params_digest(get_params(node.model)) == _rows(state)[-1]["params_digest"]  # what round 1 ended with
    assert run_dpo_node(_cfg(model_dir, 4), state, log_level="warning") == 0
    assert [r["round"] for r in _rows(state)] == [0, 1, 2, 3]


def test_a_checkpoint_of_another_user_is_refused(model_dir: Path, tmp_path: Path) -> None:
    from swarm_node.errors import UserFacingError

    assert run_dpo_node(_cfg(model_dir, 1), tmp_path / "s", log_level="warning") == 0
    node = DPONode(_cfg(model_dir, 2, "dpo.user=3"), tmp_path / "s")
    with pytest.raises(UserFacingError, match="another model/task configuration"):
        node.resume()


def test_a_rows_refused_parameters_are_that_rounds_own(model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """A neighbour whose parameter payload is junk in rounds 0 and 1 and good in round 2: each row counts only
    its round's refusals, under the registry's `params:` family (they were running totals, unprefixed)."""
    node = DPONode(_cfg(model_dir, 3, "dpo.averaging=gossip", "dpo.topology=ring"), tmp_path / "s")
    me = node.neighbourhood.self_id
    from swarm_node.dpo.vectors import get_params
    from swarm_node.swarm.averaging.payload import encode_params

    good = encode_params(get_params(node.model), node.arch_fp, node.cfg.dpo.compression)
    sent = {0: b"\xff" * 256, 1: b"\x00" * 3, 2: good}
    monkeypatch.setattr(node.neighbourhood, "peers", lambda: sorted([me, "neighbour"]))
    monkeypatch.setattr(node.neighbourhood, "fetch_all", lambda to_fetch, r: {p: sent[r] for p in to_fetch})
    rows = [node.run_round(evaluate=lambda: False) for _ in range(3)]
    assert [r["rejected"] for r in rows] == [{"params:bad_header": 1}, {"params:truncated": 1}, {}]
    assert [r["missing_neighbours"] for r in rows] == [["neighbour"], ["neighbour"], []]
