"""The task universe and the local mix: peers that sample other parts of one universe share a swarm.

The universe (`task_id`, on the wire) is what a receiver needs to rebuild and score a prompt from its id; the
mix (`task.mix`, reasoning-gym weights) is how often a node samples each part, a local setting. A batch from
the same universe and another mix is admitted and trained on; one from another universe is declined and
counted; a malformed mix stops the node in one line with exit 2.
"""

from __future__ import annotations

import numpy as np
import pytest

from swarm_node.cli import main
from swarm_node.config import TaskConfig, TrainingConfig
from swarm_node.errors import UserFacingError
from swarm_node.evaluation import accuracy_by_part
from swarm_node.generation.base import Sample
from swarm_node.grpo.rollouts import Expectations, LocalRollouts, peer_groups, score
from swarm_node.models.factory import build_tokenizer
from swarm_node.models.loading import tokenizer_fingerprint
from swarm_node.protocol import decode_batch, encode_batch
from swarm_node.tasks import get_task
from swarm_node.tasks.arithmetic import _ID_RE, ArithmeticTask, _is_held_out
from swarm_node.tasks.reasoning_gym import ReasoningGymTask

SMALL_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


# ---- arithmetic: parts and mixes ---------------------------------------------------------------------


def test_a_mix_samples_only_its_parts_and_never_a_held_out_problem():
    add = ArithmeticTask(mix={"add": 1})
    signed = ArithmeticTask(mix={"signed": 1})
    both = ArithmeticTask(mix={"sub": 1, "signed": 3})
    assert add.task_id == signed.task_id == both.task_id == ArithmeticTask().task_id == "arithmetic-v2"
    a = add.train_prompts(300, np.random.default_rng(0))
    assert {add.part_of(p) for p in a} == {"add"} and all("+" in p.text and p.text[0].isdigit() for p in a)
    s = signed.train_prompts(300, np.random.default_rng(0))
    assert {signed.part_of(p) for p in s} == {"signed"}
    assert all(p.id.startswith("arith:signed:") and p.text.startswith("+") for p in s)
    for p in a + s:  # any node of the universe rebuilds them, whatever its own mix; none is an eval problem
        assert ArithmeticTask().prompt_from_id(p.id) == p
        a_, op, b_ = _ID_RE.fullmatch(p.id).group(2, 3, 4)
        assert not _is_held_out(int(a_), op, int(b_))
        assert p.answer == str(eval(p.text.rstrip("=")))  # noqa: S307 (digits and one or two signs)
    share = np.mean([both.part_of(p) == "signed" for p in both.train_prompts(800, np.random.default_rng(1))])
    assert 0.70 <= share <= 0.80, share  # weight 1:3
    assert len({p.id for p in s}) == len(s)  # a round's prompts are distinct


def test_the_default_mix_draws_the_v1_universe_prompts_seed_for_seed():
    """Every earlier figure's prompts (and the presets' warm-up checks) stay reproducible."""
    def v1(n: int, rng: np.random.Generator) -> list[str]:  # the v1 draw: a, b uniform, then the operator
        out: list[str] = []
        while len(out) < n:
            a, b = (int(x) for x in rng.integers(0, 100, size=2))
            op = "+-"[int(rng.integers(0, 2))]
            if not _is_held_out(a, op, b) and f"arith:id:{a}{op}{b}" not in out:
                out.append(f"arith:id:{a}{op}{b}")
        return out

    for mix in (None, {"add": 1, "sub": 1}, {"add": 2, "sub": 2, "signed": 0}):
        got = [p.id for p in ArithmeticTask(mix=mix).train_prompts(64, np.random.default_rng(5))]
        assert got == v1(64, np.random.default_rng(5)), mix


def test_held_out_signed_problems_are_refused_even_in_the_signed_format():
    task = ArithmeticTask(mix={"signed": 1})
    for p in task.eval_prompts("id", 30):
        assert task.prompt_from_id(p.id.replace("arith:id:", "arith:signed:")) is None
    union = task.eval_prompts("union", 30)
    assert [task.part_of(p) for p in union[:6]] == ["add", "sub", "signed"] * 2
    assert all(task.prompt_from_id(p.id) is None for p in union)  # eval problems never train


@pytest.mark.parametrize(("mix", "needle"), [
    ({"mul": 1}, "unknown part 'mul'"),
    ({"add": -1}, "task.mix.add must be a non-negative number"),
    ({"add": "lots"}, "task.mix.add must be a non-negative number"),
    ({"add": 0, "sub": 0}, "every weight is 0"),
    ("add", "must be a mapping part -> weight"),
])
def test_malformed_mixes_are_one_line_errors(mix, needle):
    with pytest.raises(UserFacingError, match=needle) as exc:
        get_task(TaskConfig(mix=mix))
    assert "\n" not in str(exc.value)


def test_malformed_mix_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()  # the mix is checked before the model would load
    rc = main(["run", "--state-dir", str(tmp_path / "s"), "--set", f"model.path={not_a_model}",
               "--set", "rounds=1", "--set", "task.mix={add: 1, mul: 2}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "task.mix: unknown part 'mul'" in err and "add, sub, signed" in err, err


def test_a_mix_needs_a_task_with_parts(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"question": "q{i}", "answer": "#### {i}"}}\n' for i in range(4)))
    with pytest.raises(UserFacingError, match="has no parts"):
        get_task(TaskConfig(name="gsm8k", data_path=str(data), mix={"a": 1}))


# ---- reasoning-gym: the weights are the mix ----------------------------------------------------------


def test_reasoning_gym_universe_ignores_weights_and_order_but_not_configs():
    a = ReasoningGymTask({"chain_sum": {"weight": 3, "config": SMALL_SUM}, "gcd": {"weight": 1}})
    b = ReasoningGymTask({"gcd": {"weight": 0}, "chain_sum": {"config": SMALL_SUM}})  # samples chain_sum only
    c = ReasoningGymTask({"chain_sum": {"config": SMALL_SUM}, "gcd": {}}, mix={"gcd": 1})
    other = ReasoningGymTask({"chain_sum": {"config": {**SMALL_SUM, "max_digits": 3}}, "gcd": {}})
    assert a.task_id == b.task_id == c.task_id != other.task_id
    assert {b.part_of(p) for p in b.train_prompts(50, np.random.default_rng(0))} == {"chain_sum"}
    assert {c.part_of(p) for p in c.train_prompts(50, np.random.default_rng(0))} == {"gcd"}
    for p in c.train_prompts(20, np.random.default_rng(1)):  # a peer of the same universe rebuilds and scores
        assert b.prompt_from_id(p.id) == p and other.prompt_from_id(p.id) is None
    with pytest.raises(UserFacingError, match="every weight is 0"):
        ReasoningGymTask({"chain_sum": {"weight": 0}})
    with pytest.raises(UserFacingError, match="unknown part 'basic_arithmetic'"):
        ReasoningGymTask(["chain_sum"], mix={"basic_arithmetic": 1})


# ---- files: a part field ------------------------------------------------------------------------------


def test_files_part_field_gives_a_mix_and_parts_without_changing_the_universe(tmp_path):
    from swarm_node.tasks.files import FilesTask

    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"prompt": "p{i}", "answer": "a{i}", "subject": "{"ab"[i % 2]}"}}\n'
                            for i in range(40)))
    plain = FilesTask(data)
    only_b = FilesTask(data, part_field="subject", mix={"b": 1})
    assert plain.task_id == only_b.task_id and only_b.parts == ("a", "b") and plain.parts == ()
    prompts = only_b.train_prompts(10, np.random.default_rng(0))
    assert {only_b.part_of(p) for p in prompts} == {"b"} and all(plain.prompt_from_id(p.id) == p for p in prompts)
    ev = only_b.eval_prompts("id", 4)
    assert [only_b.part_of(p) for p in ev] == ["a", "b", "a", "b"]
    with pytest.raises(UserFacingError, match="needs task.part_field"):
        FilesTask(data, mix={"b": 1})


# ---- admission: another mix is admitted, another universe declined -------------------------------------


def _peer_batch(tok, task, round_: int = 2):
    """A peer's real-format batch of 4 prompts x 4 completions (two right, two wrong) of its own mix."""
    prompts = task.train_prompts(4, np.random.default_rng(round_))
    ids = [tok(p.text, add_special_tokens=False)["input_ids"] for p in prompts]

    def sample(text: str) -> Sample:
        t = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return Sample(np.asarray(t), -np.linspace(0.1, 1.0, len(t)).astype(np.float32), True)

    samples = [[sample(p.answer), sample(p.answer), sample("7" + p.answer), sample("x")] for p in prompts]
    local = LocalRollouts(prompts, ids, samples, score(task, tok, prompts, samples))
    batch = local.to_batch(swarm_id="s", task_id=task.task_id, tokenizer_fp=tokenizer_fingerprint(tok),
                           model_name="peer", round_=round_, vocab_size=len(tok))
    return decode_batch(encode_batch(batch))  # through the wire, as a receiver sees it


def test_a_peer_with_another_mix_is_admitted_and_trained_on(tok):
    from swarm_node.models.factory import PRESETS, build_model
    from swarm_node.training.ftis_step import FTISTrainer

    me, peer = ArithmeticTask(mix={"add": 1}), ArithmeticTask(mix={"signed": 1})
    expect = Expectations(swarm_id="s", task_id=me.task_id, tokenizer_fp=tokenizer_fingerprint(tok),
                          vocab_size=len(tok))
    adm = peer_groups(_peer_batch(tok, peer), "peer", me, tok, expect)
    assert not adm.rejected and len(adm.groups) == 4 and adm.rewards_changed == 0
    assert [g.rewards.tolist() for g in adm.groups] == [[1.0, 1.0, 0.0, 0.0]] * 4  # recomputed by the receiver
    model = build_model(PRESETS["tiny-s"], len(tok), tok.pad_token_id, tok.eos_token_id, seed=0)
    res = FTISTrainer(model, TrainingConfig(), tok.pad_token_id, lr_default=1e-3).step(adm.groups)
    assert res.stepped and res.groups_external == 4


def test_a_peer_from_another_universe_is_declined_and_counted(tok):
    me = ArithmeticTask()
    rg = ReasoningGymTask({"chain_sum": {"config": SMALL_SUM, "template": "{metadata[expression]} ="}})
    expect = Expectations(swarm_id="s", task_id=me.task_id, tokenizer_fp=tokenizer_fingerprint(tok),
                          vocab_size=len(tok))
    batch = _peer_batch(tok, rg)
    adm = peer_groups(batch, "peer", me, tok, expect)
    assert adm.groups == [] and dict(adm.rejected) == {"task_mismatch": 1}
    batch.task_id = me.task_id  # a foreign batch that claims our universe: every prompt id is refused
    adm = peer_groups(batch, "peer", me, tok, expect)
    assert adm.groups == [] and dict(adm.rejected) == {"unknown_prompt": 4}


# ---- evaluation per part ------------------------------------------------------------------------------


def test_accuracy_per_part_sums_to_the_union():
    task = ArithmeticTask()
    prompts = task.eval_prompts("union", 100)
    rng = np.random.default_rng(0)
    hits = [bool(h) for h in rng.random(len(prompts)) < np.where(
        [task.part_of(p) == "signed" for p in prompts], 0.1, 0.5)]
    parts = accuracy_by_part(task, prompts, hits)
    assert list(parts) == ["add", "sub", "signed"] and sum(d["n"] for d in parts.values()) == 100
    union = sum(d["accuracy"] * d["n"] for d in parts.values()) / 100
    assert union == pytest.approx(np.mean(hits), abs=1e-12)
    assert accuracy_by_part(task, task.eval_prompts("ood3", 10), [True] * 10) == {}  # not a part of the universe
