"""`swarm-node eval` and `swarm_node.evaluation.evaluate` against a hand-written greedy loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from swarm_node.evaluation import evaluate, greedy_accuracy
from swarm_node.models.factory import PRESETS, build_model, build_tokenizer
from swarm_node.models.loading import load_model
from swarm_node.tasks.arithmetic import ArithmeticTask
from swarm_node.tasks.base import Prompt

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT / "tests" / "data" / "gsm8k_small.jsonl"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    tok = build_tokenizer()
    model = build_model(PRESETS["tiny-s"], len(tok), tok.pad_token_id, tok.eos_token_id, seed=3)
    path = tmp_path_factory.mktemp("evalmodel") / "tiny-random"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SWARM_NODE_PRESETS": str(tmp_path / "presets")}  # never build a real preset here
    return subprocess.run([sys.executable, "-m", "swarm_node.cli", "eval", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


@torch.no_grad()
def hand_greedy(model, tokenizer, text: str, max_new_tokens: int) -> str:
    """One prompt at a time, full forward each step, stop at EOS: no padding, no cache, no generator."""
    seq = tokenizer(text, add_special_tokens=False)["input_ids"]
    out = []
    for _ in range(max_new_tokens):
        nxt = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
        if nxt == tokenizer.eos_token_id:
            break
        out.append(nxt)
        seq.append(nxt)
    return tokenizer.decode(out, skip_special_tokens=True)


@pytest.mark.slow  # starts a DHT or a subprocess
def test_cli_json_matches_a_hand_loop(model_dir, tmp_path):
    n = 12
    res = cli("--model", str(model_dir), "--task", "arithmetic", "--split", "ood", "--n", str(n), "--json",
              tmp_path=tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["n"] == n and 0.0 <= out["accuracy"] <= 1.0
    assert out["split"] == "ood" and out["task"] == "arithmetic" and out["model"] == str(model_dir)
    assert out["max_new_tokens"] == 8 and out["seconds"] > 0
    assert out["by_part"] == {"signed": {"accuracy": out["accuracy"], "n": n}}  # ood is the signed part's eval
    assert len(out["hits"]) == n and out["hits"].count("1") == round(out["accuracy"] * n)
    loaded = load_model(str(model_dir), dtype="float32", device="cpu")
    loaded.model.eval()
    task = ArithmeticTask()
    hits = [task.is_correct(p, hand_greedy(loaded.model, loaded.tokenizer, p.text, 8))
            for p in task.eval_prompts("ood", n)]
    assert out["accuracy"] == pytest.approx(float(np.mean(hits)))


@pytest.mark.slow  # starts a DHT or a subprocess
def test_cli_readable_line_and_errors(model_dir, tmp_path):
    res = cli("--model", str(model_dir), "--n", "3", "--max-new-tokens", "2", tmp_path=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "accuracy" in res.stdout and "/3)" in res.stdout
    bad = cli("--model", str(model_dir), "--task", "gsm8k", "--data-path", str(GSM8K), "--split", "ood",
              "--n", "2", tmp_path=tmp_path)
    assert bad.returncode == 2 and "eval_split 'ood'" in bad.stderr and "Traceback" not in bad.stderr
    missing = cli("--model", str(tmp_path / "nope"), "--n", "2", tmp_path=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    neither = tmp_path / "neither"
    neither.mkdir()
    (neither / "notes.txt").write_text("not a model")
    res = cli("--model", str(neither), "--n", "2", tmp_path=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().count("\n") == 0 and "not a model directory" in res.stderr, res.stderr


class ScriptedTask(ArithmeticTask):
    """Arithmetic prompts whose 'answer' is chosen by the test: correct iff the completion equals it."""

    def __init__(self, answers: dict[str, str]):
        super().__init__()
        self.answers = answers

    def eval_prompts(self, split: str, n: int) -> list[Prompt]:
        return [Prompt(p.id, p.text, self.answers[p.text]) for p in super().eval_prompts(split, n)]

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 1.0 if completion == prompt.answer else 0.25


def test_evaluate_counts_exactly_what_is_correct_and_matches_greedy_accuracy(model_dir):
    """A random model scores 0 on arithmetic, so make half the prompts 'correct' by construction."""
    loaded = load_model(str(model_dir), dtype="float32", device="cpu")
    tok = loaded.tokenizer
    base = ArithmeticTask().eval_prompts("id", 10)
    loaded.model.eval()
    greedy = {p.text: hand_greedy(loaded.model, tok, p.text, 5) for p in base}
    answers = {p.text: (greedy[p.text] if i % 2 == 0 else greedy[p.text] + "#") for i, p in enumerate(base)}
    task = ScriptedTask(answers)
    res = evaluate(loaded.model, tok, task, "id", 10, max_new_tokens=5, batch_size=3)
    assert res["n"] == 10 and res["split"] == "id"
    assert res["accuracy"] == pytest.approx(0.5)
    assert res["reward_mean"] == pytest.approx(0.5 * 1.0 + 0.5 * 0.25)
    assert greedy_accuracy(loaded.model, tok, task, task.eval_prompts("id", 10), max_new_tokens=5) == res["accuracy"]


def test_evaluate_with_no_prompts(model_dir):
    loaded = load_model(str(model_dir), dtype="float32", device="cpu")
    res = evaluate(loaded.model, loaded.tokenizer, ArithmeticTask(), "id", 0, max_new_tokens=2)
    assert res["n"] == 0 and res["accuracy"] == 0.0


def test_a_state_dir_is_scored_in_the_prompt_form_its_node_trained_in(model_dir, tmp_path, capsys, monkeypatch):
    """A node with task.prompt_form fewshot and max_operand 20 records both in its checkpoint; `swarm-node eval
    STATE_DIR` then poses the same problems the same way (plain text) without being told."""
    from swarm_node.cli import main
    from swarm_node.config import NodeConfig
    from swarm_node.grpo.round import GRPONode

    cfg = NodeConfig.model_validate({"model": {"path": str(model_dir)}, "task": {"prompt_form": "fewshot",
                                     "max_operand": 20, "eval_n": 6}, "generation": {"max_new_tokens": 4}})
    node = GRPONode(cfg, tmp_path / "state")
    node.last_round = 1
    assert node.checkpoint()
    want = node.evaluate()
    node.close()
    import swarm_node.evaluation as evaluation

    seen = {}
    real = evaluation.evaluate

    def spy(model, tok, task, split, n, max_new_tokens, batch_size=256, encode=None):
        seen["task_id"], seen["ids"] = task.task_id, [encode(p.text) for p in task.eval_prompts(split, n)]
        return real(model, tok, task, split, n, max_new_tokens, batch_size, encode)

    monkeypatch.setattr(evaluation, "evaluate", spy)
    assert main(["eval", "--model", str(tmp_path / "state"), "--n", "6", "--max-new-tokens", "4", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert seen["task_id"] == node.task.task_id == "arithmetic-v2.fewshot.max20"
    assert seen["ids"] == [node.prompts.encode(p.text) for p in node.task.eval_prompts("id", 6)]
    assert got["prompt_form"] == "fewshot" and got["chat_template"] == "off" and got["n"] == 6
    assert got["accuracy"] == want["accuracy"] and got["reward_mean"] == want["reward_mean"]
    assert main(["eval", "--model", str(tmp_path / "state"), "--max-operand", "100"]) == 2


def test_evaluate_per_part_sums_to_the_union(model_dir):
    """Each part gets its own accuracy (add 3/4, sub 1/2, signed 1/4 correct by construction), and the
    union's is their mean weighted by problem count; `hits` lists every problem in order."""
    loaded = load_model(str(model_dir), dtype="float32", device="cpu")
    tok = loaded.tokenizer
    loaded.model.eval()
    base = ArithmeticTask().eval_prompts("union", 24)
    share = {"add": 3, "sub": 2, "signed": 1}  # of every 4 problems of the part, this many are right
    seen: dict[str, int] = {}
    answers = {}
    for p in base:
        part = ArithmeticTask().part_of(p)
        k = seen[part] = seen.get(part, 0) + 1
        g = hand_greedy(loaded.model, tok, p.text, 5).strip()  # the reward compares stripped text
        answers[p.text] = g if (k - 1) % 4 < share[part] else g + "#"
    res = evaluate(loaded.model, tok, ScriptedTask(answers), "union", 24, max_new_tokens=5, batch_size=5)
    parts = res["by_part"]
    assert {k: v["n"] for k, v in parts.items()} == {"add": 8, "sub": 8, "signed": 8}
    assert {k: v["accuracy"] for k, v in parts.items()} == {"add": 0.75, "sub": 0.5, "signed": 0.25}
    assert res["accuracy"] == pytest.approx(sum(v["accuracy"] * v["n"] for v in parts.values()) / res["n"])
    assert len(res["hits"]) == 24 and res["hits"].count("1") == 12
