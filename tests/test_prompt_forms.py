"""Prompt forms for real language models (bare / fewshot / chat) and the answer extraction behind their rewards."""

from __future__ import annotations

import numpy as np
import pytest

from swarm_node.config import NodeConfig
from swarm_node.errors import ConfigError
from swarm_node.generation.prompts import chat_template_setting
from swarm_node.tasks.answers import final_integer, first_line_answer, integer_reward
from swarm_node.tasks.arithmetic import ArithmeticTask
from swarm_node.tasks.prompt_forms import ARITHMETIC_SHOTS


@pytest.mark.parametrize("text, want", [
    ("19", 19), (" 19<|im_end|>", 19), ("12 + 7 = 19", 19), ("12+7=19.", 19), ("3 - 15 = -12", -12),
    ("3-15=-12", -12), ("-12", -12), ("The answer is 19.", 19), ("The sum of 12 and 7 is 19", 19),
    ("19\n45-23=22", 19), ("\n\n  19  \nmore", 19), ("12 + 7 = 19 (nineteen)", 19), ("1,024", 1024),
    ("15-3", 3), ("12 + 7", 7), ("2.5", None), ("nineteen", None), ("", None), ("=", None),
])
def test_final_integer_survives_restated_problems(text, want):
    assert final_integer(text) == want


def test_integer_reward_is_exact():
    assert integer_reward("12 + 7 = 19", "19") == 1.0
    assert integer_reward("12 + 7 = 18", "19") == 0.0
    assert integer_reward("12 + 7 = 190", "19") == 0.0  # no credit for "close" or for containing the digits
    assert integer_reward("19", "-19") == 0.0
    assert integer_reward("x", "19") == 0.0 and integer_reward("19", "n/a") == 0.0


def test_first_line_answer_for_free_text():
    assert first_line_answer("Answer: 31.\nQuestion: next") == "31"
    assert first_line_answer("The final answer is 7") == "7"
    assert first_line_answer("\n blue \n") == "blue"


def test_arithmetic_forms_pose_the_same_problems():
    bare, few, chat = (ArithmeticTask(form=f) for f in ("bare", "fewshot", "chat"))
    assert (bare.task_id, few.task_id, chat.task_id) == ("arithmetic-v2", "arithmetic-v2.fewshot", "arithmetic-v2.chat")
    rng = lambda: np.random.default_rng(7)  # noqa: E731
    for task in (few, chat):
        b_train, t_train = bare.train_prompts(5, rng()), task.train_prompts(5, rng())
        assert [p.id for p in b_train] == [p.id for p in t_train]  # same problems, same ids
        assert [p.answer for p in b_train] == [p.answer for p in t_train]
        for bp, tp in zip(b_train, t_train, strict=True):
            assert bp.text[:-1] in tp.text and tp.text != bp.text
            assert task.prompt_from_id(tp.id) == tp  # a peer's id rebuilds the prompt in this form
        assert [p.id for p in task.eval_prompts("id", 20)] == [p.id for p in bare.eval_prompts("id", 20)]
    p = few.eval_prompts("id", 1)[0]
    assert p.text.endswith("\n" + bare.eval_prompts("id", 1)[0].text) and p.text.count("\n") == len(ARITHMETIC_SHOTS)
    assert ArithmeticTask(form="chat").eval_prompts("ood", 1)[0].text.startswith("Compute +")


def test_fewshot_examples_are_training_problems():
    task = ArithmeticTask()
    for q, a in ARITHMETIC_SHOTS:
        assert not task.is_held_out(f"arith:id:{q}"), q  # an eval problem's answer must never sit in a prompt
        assert task.prompt_from_id(f"arith:id:{q}").answer == a


def test_rewards_per_form():
    bare, chat = ArithmeticTask(form="bare"), ArithmeticTask(form="chat")
    p = bare.prompt_from_id("arith:id:45-23")
    assert bare.reward(p, "22") == 1.0 and bare.reward(p, "45-23=22") == 0.0  # tiny presets: whole completion
    q = chat.prompt_from_id("arith:id:45-23")
    assert chat.reward(q, "45 - 23 = 22") == 1.0 and chat.reward(q, "22\nok") == 1.0 and chat.reward(q, "23") == 0.0
    assert chat.is_correct(q, "45-23 = 22")


def test_reasoning_gym_forms():
    from swarm_node.tasks.reasoning_gym import SHOTS, ReasoningGymTask

    bare, few, chat = (ReasoningGymTask(["chain_sum"], form=f) for f in ("bare", "fewshot", "chat"))
    assert few.task_id == bare.task_id + ".fewshot" and chat.task_id == bare.task_id + ".chat"
    pb, pf, pc = (t.eval_prompts("id", 1)[0] for t in (bare, few, chat))
    assert pb.id == pf.id == pc.id and pf.text.endswith(f"Question: {pb.text}\nAnswer:") and pb.text in pc.text
    assert pf.text.count("Answer:") == SHOTS + 1
    for shot in pf.text.split("\n\n")[:SHOTS]:  # the solved examples are training problems
        question = shot.split("\n")[0].removeprefix("Question: ")
        assert question != pb.text
    assert few.reward(pf, pf.answer + "\n\nQuestion: made up") == 1.0
    assert chat.reward(pc, f"The answer is {pc.answer}.") == 1.0 and chat.reward(pc, "0\n" + pc.answer) < 1.0


def test_fewshot_is_plain_text():
    assert chat_template_setting("auto", "fewshot") == "off"
    assert chat_template_setting("auto", "chat") == "auto" and chat_template_setting("off", "chat") == "off"
    NodeConfig.model_validate({"task": {"prompt_form": "fewshot"}, "generation": {"chat_template": "off"}})
    with pytest.raises(ValueError, match="fewshot"):
        NodeConfig.model_validate({"task": {"prompt_form": "fewshot"}, "generation": {"chat_template": "on"}})


def test_prompt_form_is_checked_by_the_config_loader(tmp_path):
    from swarm_node.config import load_config

    with pytest.raises(ConfigError, match="task.prompt_form"):
        load_config(None, ["task.prompt_form=story"])


def test_tasks_without_forms_refuse_one():
    from swarm_node.config import TaskConfig
    from swarm_node.errors import UserFacingError
    from swarm_node.tasks import get_task

    with pytest.raises(UserFacingError, match="prompt_form"):
        get_task(TaskConfig(name="gsm8k", data_path="x.jsonl", prompt_form="chat"))
    assert get_task(TaskConfig(name="arithmetic", prompt_form="chat")).task_id == "arithmetic-v2.chat"


def test_threads_setting_reaches_torch(monkeypatch, tmp_path):
    """`threads: N` sets torch's compute threads before the node starts (the demo's peers default to 1)."""
    import torch

    import swarm_node.grpo.round as grpo_round
    from swarm_node.cli import main

    seen = []
    monkeypatch.setattr(grpo_round, "run_grpo_node", lambda cfg, state_dir, log_level: seen.append(
        torch.get_num_threads()) or 0)
    prev = torch.get_num_threads()
    try:
        target = 3 if prev != 3 else 2
        assert main(["run", "--state-dir", str(tmp_path / "s"), "--set", f"threads={target}"]) == 0
        assert seen == [target]
    finally:
        torch.set_num_threads(prev)


def test_max_operand_narrows_the_id_split():
    """task.max_operand: an easier id split for a small real model; held-out problems stay the 0..99 split's
    own (the same hash), so no eval problem of either task is ever trained on by the other."""
    import re

    small, full = ArithmeticTask(form="chat", max_operand=20), ArithmeticTask(form="chat")
    assert small.task_id == "arithmetic-v2.chat.max20" and full.task_id == "arithmetic-v2.chat"
    operands = lambda p: [int(x) for x in re.findall(r"\d+", p.id.split(":")[2])]  # noqa: E731
    train = small.train_prompts(300, np.random.default_rng(0))
    assert all(max(operands(p)) <= 20 for p in train) and len({p.id for p in train}) == 300
    held = small.eval_prompts("id", 10_000)
    assert 50 < len(held) < 120 and all(max(operands(p)) <= 20 for p in held)
    assert {p.id for p in held} <= {p.id for p in full.eval_prompts("id", 10_000)}
    assert not {p.id for p in train} & {p.id for p in held}
    assert small.prompt_from_id("arith:id:21+3") is None and small.prompt_from_id("arith:id:20+3") is not None
    with pytest.raises(ValueError):
        ArithmeticTask(max_operand=100)
