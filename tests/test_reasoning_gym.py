"""reasoning-gym tasks: the real generators and scorers, seeded, with held-out problems kept out of training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import reasoning_gym
import torch

from swarm_node.config import TaskConfig
from swarm_node.errors import UserFacingError
from swarm_node.tasks import get_task
from swarm_node.tasks.reasoning_gym import SIZE, ReasoningGymTask, parse_datasets

SMALL_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


@pytest.fixture(scope="module")
def mix() -> ReasoningGymTask:
    return ReasoningGymTask({"chain_sum": {"weight": 3, "config": SMALL_SUM}, "gcd": {"weight": 1}})


def test_list_and_mapping_forms():
    assert [s.name for s in parse_datasets(["chain_sum", "gcd"])] == ["chain_sum", "gcd"]
    specs = parse_datasets({"chain_sum": {"weight": 2, "config": {"max_terms": 3}}, "gcd": None})
    assert (specs[0].weight, specs[0].config, specs[1].weight) == (2.0, {"max_terms": 3}, 1.0)
    task = get_task(TaskConfig(name="reasoning_gym", datasets=["chain_sum"]))
    assert task.task_id.startswith("reasoning-gym-")


def test_weights_and_determinism(mix):
    a = mix.train_prompts(400, np.random.default_rng(1))
    b = mix.train_prompts(400, np.random.default_rng(1))
    assert [p.id for p in a] == [p.id for p in b]
    share = np.mean([mix.dataset_of(p) == "chain_sum" for p in a])
    assert 0.68 <= share <= 0.82, share  # weight 3:1
    assert len({p.text for p in a}) == len(a)  # a round's prompts are distinct
    other = ReasoningGymTask({"chain_sum": {"weight": 3, "config": {**SMALL_SUM, "max_digits": 3}}, "gcd": {}})
    assert other.task_id != mix.task_id  # another config is another task: peers decline each other


def test_held_out_problems_never_train(mix):
    held = mix.eval_prompts("id", 100)
    assert {mix.dataset_of(p) for p in held} == {"chain_sum", "gcd"}
    held_q = {p.text for p in held}
    train = mix.train_prompts(3000, np.random.default_rng(2))
    assert not held_q & {p.text for p in train}
    assert all(mix.prompt_from_id(p.id) is None for p in held)  # a peer cannot slip one in
    for p in train[:50]:
        assert mix.prompt_from_id(p.id) == p


def test_rewards_are_the_datasets_own_score_answer(mix):
    ds = reasoning_gym.create_dataset("chain_sum", seed=mix.seed, size=SIZE, **SMALL_SUM)
    prompts = [p for p in mix.train_prompts(60, np.random.default_rng(3)) if mix.dataset_of(p) == "chain_sum"]
    for p in prompts[:20]:
        entry = ds[int(p.id.rsplit(":", 1)[1])]
        assert entry["question"] == p.text and entry["answer"] == p.answer
        for completion in (p.answer, p.answer + "0", " " + p.answer + "\n", "x", ""):
            assert mix.reward(p, completion) == pytest.approx(ds.score_answer(completion.strip(), entry))
        wrong = str(int(p.answer) + 1)
        assert mix.is_correct(p, p.answer) and not mix.is_correct(p, wrong) and mix.reward(p, wrong) < 1.0
        assert mix.reward(p, "0" + p.answer.lstrip("-")) == ds.score_answer("0" + p.answer.lstrip("-"), entry)


@pytest.mark.parametrize("pid", [
    "", "rg:00000000:chain_sum:5", "rg:{fp}:products:5", f"rg:{{fp}}:chain_sum:{SIZE}", "rg:{fp}:chain_sum:007",
    "rg:{fp}:chain_sum:-1", "rg:{fp}:chain_sum", "arith:id:1+2", "rg:{fp}:chain_sum:5" + "9" * 200,
])
def test_junk_ids_are_refused(mix, pid):
    assert mix.prompt_from_id(pid.replace("{fp}", mix.fp)) is None


@pytest.mark.parametrize("datasets, pattern", [
    (["no_such_dataset"], "unknown reasoning-gym dataset 'no_such_dataset'"),
    ({"chain_sum": {"weight": 0}}, "every weight is 0"),  # weight 0 alone: in the universe, nothing to sample
    ({"chain_sum": {"weight": "heavy"}}, "weight must be a non-negative number"),
    ({"chain_sum": {"weight": -1}}, "weight must be a non-negative number"),
    ({"chain_sum": {"config": {"no_such_option": 1}}}, "reasoning-gym refused the config"),
    ({"chain_sum": {"config": {"min_terms": 5, "max_terms": 2}}}, "reasoning-gym refused the config"),
    ({"chain_sum": {"wieght": 2}}, r"expected \{weight"),
    ({"chain_sum": {"template": "{metadata[nope]}="}}, "does not fit its entries"),
    ({"chain_sum": {"template": 3}}, "template must be a non-empty string"),
    ([], "task.datasets is empty"),
    (["chain_sum", "chain_sum"], "names a dataset twice"),
    (["propositional_logic"], "propositional_logic"),
    (7, "must be a list"),
])
def test_bad_specs_are_one_line_errors(datasets, pattern):
    with pytest.raises(UserFacingError, match=pattern) as info:
        ReasoningGymTask(datasets)
    assert "\n" not in str(info.value)


def test_template_makes_short_prompts_and_is_part_of_the_task():
    task = ReasoningGymTask({"chain_sum": {"config": SMALL_SUM, "template": "{metadata[expression]} ="}})
    plain = ReasoningGymTask({"chain_sum": {"config": SMALL_SUM}})
    p = task.train_prompts(5, np.random.default_rng(0))
    q = plain.train_prompts(5, np.random.default_rng(0))
    assert [x.id.split(":")[2:] for x in p] == [x.id.split(":")[2:] for x in q]  # same problems
    for a, b in zip(p, q, strict=True):
        assert b.text.endswith(a.text) and len(a.text) < 12 and a.answer == b.answer
        assert task.prompt_from_id(a.id) == a
    assert task.task_id != plain.task_id


def test_missing_datasets_key():
    with pytest.raises(UserFacingError, match="task.datasets is required"):
        get_task(TaskConfig(name="reasoning_gym"))


def test_eval_reports_each_dataset(mix):
    from swarm_node.evaluation import evaluate
    from swarm_node.models.factory import PRESETS, build_model, build_tokenizer

    tok = build_tokenizer()
    model = build_model(PRESETS["tiny-s"], len(tok), tok.pad_token_id, tok.eos_token_id, seed=0)
    with torch.no_grad():
        res = evaluate(model, tok, mix, "id", 10, max_new_tokens=3)
    assert set(res["by_part"]) == {"chain_sum", "gcd"}
    assert sum(d["n"] for d in res["by_part"].values()) == res["n"] == 10
    union = sum(d["accuracy"] * d["n"] for d in res["by_part"].values()) / res["n"]
    assert union == pytest.approx(res["accuracy"])


@pytest.mark.slow
def test_a_node_trains_on_chain_sum_offline(presets_dir, tmp_path):
    """Acceptance: `task: {name: reasoning_gym, datasets: [chain_sum]}` runs the real round loop offline, and
    with the short template of peers/rg-tiny-s.yaml the groups carry signal and the model changes."""
    from swarm_node.config import NodeConfig, load_config
    from swarm_node.grpo.round import GRPONode

    def cfg(datasets):
        return NodeConfig.model_validate({
            "model": {"path": "tiny-s"}, "task": {"name": "reasoning_gym", "datasets": datasets,
                                                  "prompts_per_round": 8, "eval_n": 8},
            "generation": {"num_generations": 4, "max_new_tokens": 6}, "training": {"lr": 1e-3},
        })

    plain = GRPONode(cfg(["chain_sum"]), tmp_path / "plain")
    rows = [plain.run_round() for _ in range(2)]
    # every prompt made a group: trained on, or skipped for equal rewards (the full question is at the floor)
    assert [r["local_groups"] + r["zero_advantage_groups"] for r in rows] == [8, 8]
    assert set(plain.evaluate()["by_part"]) == {"chain_sum"}

    peers = load_config(Path(__file__).resolve().parents[1] / "peers" / "rg-tiny-s.yaml", [])
    node = GRPONode(cfg(peers.task.datasets), tmp_path / "short")
    before = {n: p.detach().clone() for n, p in node.loaded.model.named_parameters()}
    rows = [node.run_round() for _ in range(3)]
    assert any(r["stepped"] for r in rows), rows  # some group had unequal rewards, so training happened
    after = dict(node.loaded.model.named_parameters())
    assert any(not torch.equal(before[n], after[n].detach()) for n in before)
    ev = node.evaluate()
    # eval per dataset works on the trained model (8 problems after 3 rounds is too few to require a hit)
    assert set(ev["by_part"]) == {"chain_sum"} and ev["n"] == 8 and ev["by_part"]["chain_sum"]["n"] == 8
