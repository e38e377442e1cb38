"""The admission stage (grpo/admission.py): a round's received batches -> groups to train on + rejections.

In-process, on the real codec, tokenizer and task. Our "model" here is the sampler itself (`recompute`
returns the log-probs a batch claims unless told otherwise), so an honest batch passes both audits and a
fabricated one is refused by the log-prob audit, as it is with a trained model (tests/test_hostile_rollouts.py
tests the audits' statistics).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from swarm_node.config import NodeConfig
from swarm_node.generation.base import Sample
from swarm_node.grpo.admission import Admission, check_payload, payload_check
from swarm_node.grpo.rollouts import Expectations, LocalRollouts, score
from swarm_node.grpo.round import receive_limits
from swarm_node.models.factory import build_tokenizer
from swarm_node.models.loading import tokenizer_fingerprint
from swarm_node.node import reasons
from swarm_node.protocol import RolloutBatch, encode_batch
from swarm_node.swarm import MemberRecord, Offer, PayloadRefused, Received
from swarm_node.tasks.arithmetic import ArithmeticTask

SWARM = "unit"
ROUND = 5


task = ArithmeticTask()


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()  # the tiny presets' tokenizer


def _cfg(**swarm) -> NodeConfig:
    return NodeConfig.model_validate({"task": {"prompts_per_round": 4},
                                      "swarm": {"swarm_id": SWARM, "max_peers_per_round": 16, **swarm}})


def _expect(tok, task) -> Expectations:
    return Expectations(swarm_id=SWARM, task_id=task.task_id, tokenizer_fp=tokenizer_fingerprint(tok),
                        vocab_size=len(tok))


def recompute_as_sampler(liars: dict[str, float]):
    """Our recompute of a batch's log-probs: what its sampler gave, i.e. the claims, except for the peers in
    `liars`, whose claims are that many nats below (fabricated low log-probs buy F-TIS weight)."""

    def recompute(groups):
        return [[np.asarray(b, np.float64) + liars.get(g.source, 0.0) for b in g.behaviour_logprobs]
                for g in groups]

    return recompute


def _rollouts(tok, task, seed: int, n_prompts: int = 4, length: int = 12) -> LocalRollouts:
    """n prompts x 4 completions (right and wrong answers, padded to `length` tokens), distinct per seed."""
    rng = np.random.default_rng(seed)
    prompts = task.train_prompts(n_prompts, rng)
    ids = [tok(p.text, add_special_tokens=False)["input_ids"] for p in prompts]

    def sample(text: str) -> Sample:
        t = tok(text, add_special_tokens=False)["input_ids"]
        t = (t + [int(x) for x in rng.integers(5, len(tok) - 1, length)])[:length]
        return Sample(np.asarray(t, np.int64), -rng.uniform(0.05, 2.0, len(t)).astype(np.float32), True)

    samples = [[sample(p.answer), sample(str(int(p.answer) + 1)), sample(p.answer), sample("x")] for p in prompts]
    return LocalRollouts(prompts, ids, samples, score(task, tok, prompts, samples))


def _payload(local: LocalRollouts, tok, task, **meta) -> bytes:
    kw = dict(swarm_id=SWARM, task_id=task.task_id, tokenizer_fp=tokenizer_fingerprint(tok), model_name="peer",
              round_=ROUND, vocab_size=len(tok))
    kw.update(meta)
    return encode_batch(local.to_batch(**kw))


def _received(peer: str, payload: bytes, limits, round_: int = ROUND) -> Received:
    decoded, reason, detail = check_payload(payload, round_, limits)
    assert reason is None, detail
    member = MemberRecord(peer_id=peer, mode="grpo", model_name="tiny", tokenizer_fp="f", task_id="t", round=round_,
                          updated=0.0)
    return Received(peer, round_, payload, member, version=round_ - 1, age_s=1.5, version_lag=0, decoded=decoded)


def _admission(tok, task, cfg: NodeConfig | None = None, liars: dict[str, float] | None = None) -> Admission:
    return Admission(cfg or _cfg(), task, tok, _expect(tok, task), recompute=recompute_as_sampler(liars or {}))


def test_one_call_admits_the_honest_batch_and_counts_every_refusal_by_its_reason(tok):
    adm = _admission(tok, task, liars={"liar": 1.5})
    limits = receive_limits(_cfg())
    honest = _rollouts(tok, task, seed=1)
    batches = [
        _received("honest", _payload(honest, tok, task), limits),
        _received("replayer", _payload(honest, tok, task, model_name="replayer"), limits),  # the same completions
        _received("other-task", _payload(_rollouts(tok, task, seed=3), tok, task, task_id="other:task"), limits),
        _received("liar", _payload(_rollouts(tok, task, seed=2), tok, task), limits),
    ]
    out = adm.admit(batches, ROUND)
    assert len(out.groups) == 4 and {g.source for g in out.groups} == {"honest"}
    assert dict(out.rejected) == {"duplicate_completion": 16, "replayed_group": 4, "task_mismatch": 1,
                                  "logprob_outlier": 1}
    assert all(reasons.known(r) for r in out.rejected)
    assert out.groups_by_peer["honest"[-8:] + ":tiny"] == 4
    assert out.batch_ages_s == [1.5] and out.version_lags == [0]
    # only the honest batch passed everything: it is one round closer to being established, the others are not
    assert adm.newcomers.rounds_passed("honest") == {ROUND}
    assert adm.newcomers.rounds_passed("liar") == adm.newcomers.rounds_passed("replayer") == frozenset()
    # and its verified volume, which weighs its draw for the established slots, is what it carried through
    assert adm.newcomers.volume("honest") == sum(len(g.completions) for g in out.groups) == 16
    assert adm.newcomers.volume("liar") == 0.0


def test_our_own_samples_sent_back_count_once(tok):
    adm = _admission(tok, task)
    mine = _rollouts(tok, task, seed=4)
    adm.remember_own(ROUND, mine.train_groups())
    out = adm.admit([_received("thief", _payload(mine, tok, task), receive_limits(_cfg()))], ROUND)
    assert out.groups == [] and out.rejected["replayed_group"] == 4


def test_one_identity_gets_at_most_our_own_prompts_per_round(tok):
    adm = _admission(tok, task)
    big = _rollouts(tok, task, seed=5, n_prompts=7)
    out = adm.admit([_received("big", _payload(big, tok, task), receive_limits(_cfg()))], ROUND)
    n = len({p.id for p in big.prompts})
    assert len(out.groups) == 4 and out.rejected["share_capped"] == n - 4


def test_newcomers_beyond_their_share_wait_and_are_counted(tok):
    """max_peers_per_round 4 -> one newcomer slot a round: of three fresh identities, one is used."""
    adm = _admission(tok, task, _cfg(max_peers_per_round=4))
    limits = receive_limits(_cfg())
    batches = [_received(f"new{i}", _payload(_rollouts(tok, task, seed=10 + i), tok, task), limits) for i in range(3)]
    out = adm.admit(batches, ROUND)
    assert {g.source for g in out.groups} == {"new0"}  # first heard, first served
    assert out.rejected["newcomer_capped"] == 2
    adm.newcomers.passed_over = 3  # what the swarm's receive(choose=adm.choose) left in the buffer next round
    assert adm.admit([], ROUND + 1).rejected["newcomer_capped"] == 3


def test_one_identity_costs_at_most_our_own_completion_tokens_per_round(tok):
    """Long but correct completions pass every check; the token budget (our own round's completion tokens:
    4 prompts x 4 completions x 6 tokens = 96) keeps their compute to ours. 0 turns it off."""
    def cfg(**admission) -> NodeConfig:
        return NodeConfig.model_validate({"task": {"prompts_per_round": 4},
                                          "generation": {"num_generations": 4, "max_new_tokens": 6},
                                          "swarm": {"swarm_id": SWARM, "max_peers_per_round": 16},
                                          "admission": admission})

    limits = receive_limits(cfg())
    short = _payload(_rollouts(tok, task, seed=20, length=6), tok, task)  # 4 groups x 4 x 6 = 96 tokens
    long = _payload(_rollouts(tok, task, seed=21, length=18), tok, task)  # 3x as long: 72 tokens a group
    out = _admission(tok, task, cfg()).admit([_received("a", short, limits), _received("b", long, limits)], ROUND)
    assert sum(g.source == "a" for g in out.groups) == 4 and sum(g.source == "b" for g in out.groups) == 1
    assert out.rejected["token_capped"] == 3 and reasons.known("token_capped")
    out = _admission(tok, task, cfg(max_tokens_per_peer=0)).admit([_received("b", long, limits)], ROUND)
    assert len(out.groups) == 4 and "token_capped" not in out.rejected


def test_the_admission_section_sets_the_gate_the_share_and_the_audits(tok):
    """admission.* (docs/configuration.md) reaches the defences: the same batches, other settings, other outcomes
    than the defaults tested above."""
    cfg = NodeConfig.model_validate({
        "task": {"prompts_per_round": 4}, "swarm": {"swarm_id": SWARM, "max_peers_per_round": 4},
        "admission": {"newcomer_slots": 2, "established_after": 1, "max_groups_per_peer": 2,
                      "audit_margin": 10.0, "skew_tolerance": 0.5, "skew_window": 5, "volume_power": 0.5}})
    adm = _admission(tok, task, cfg, liars={"new1": 1.5})
    limits = receive_limits(cfg)
    batches = [_received(f"new{i}", _payload(_rollouts(tok, task, seed=10 + i), tok, task), limits) for i in range(3)]
    out = adm.admit(batches, ROUND)
    # two newcomer slots; two groups per identity; new1's lowered log-probs pass a 10.0 audit margin
    assert {g.source for g in out.groups} == {"new0", "new1"} and len(out.groups) == 4
    assert out.rejected["newcomer_capped"] == 1 and out.rejected["share_capped"] == 4
    assert "logprob_outlier" not in out.rejected
    assert adm.newcomers.established("new0")  # one passing round is enough here
    assert (adm.skew.tolerance, adm.skew.window, adm.skew.z) == (0.5, 5, 3.0)
    assert adm.newcomers.volume_power == 0.5 and _admission(tok, task).newcomers.volume_power == 2.0


def test_a_batch_the_decode_thread_did_not_check_is_refused(tok):
    adm = _admission(tok, task)
    rec = _received("p", _payload(_rollouts(tok, task, seed=6), tok, task), receive_limits(_cfg()))
    out = adm.admit([dataclasses.replace(rec, decoded=None)], ROUND)
    assert out.groups == [] and dict(out.rejected) == {"swarm:validate_error": 1}


def test_the_payload_check_decodes_under_the_limits_and_matches_the_announced_round(tok):
    limits = receive_limits(_cfg())
    check = payload_check(limits)  # the swarm's validator: (payload, offer) -> batch, or PayloadRefused
    payload = _payload(_rollouts(tok, task, seed=7), tok, task)

    def offer(round_: int) -> Offer:
        return Offer("p", round_, round_ - 1, 0.0, len(payload), "0" * 64, {})

    batch = check(payload, offer(ROUND))
    assert isinstance(batch, RolloutBatch) and batch.round == ROUND
    refused = []
    for data, announced in ((payload, ROUND + 1), (b"junk" * 10, ROUND)):
        with pytest.raises(PayloadRefused) as exc:
            check(data, offer(announced))
        refused.append(exc.value.reason)
    assert refused == ["round_mismatch", "protocol:bad_magic"]
    assert all(reasons.known(r) for r in refused)
    tight = dataclasses.replace(limits, max_groups=1)
    assert check_payload(payload, ROUND, tight)[1] == "protocol:too_many_groups"


def test_whom_we_download_from(tok):
    adm = _admission(tok, task)
    fp = tokenizer_fingerprint(tok)
    m = MemberRecord(peer_id="p", mode="grpo", model_name="x", tokenizer_fp=fp, task_id=task.task_id, round=1,
                     updated=0.0)
    assert adm.accepts_peer(m)
    assert not adm.accepts_peer(m.model_copy(update={"mode": "dpo"}))
    assert not adm.accepts_peer(m.model_copy(update={"task_id": "other"}))
    assert not adm.accepts_peer(m.model_copy(update={"tokenizer_fp": "other"}))


def test_the_download_rank_puts_established_peers_first(tok):
    """The rank a GRPO node gives the swarm for its download slots (SwarmPeer(rank=...)): a stranger is 1
    until its batches passed every check in one round, then 1 (warming), and 0 once they passed in
    established_after rounds; a peer that only announced (its download never delivered) stays 2."""
    adm = _admission(tok, task)
    limits = receive_limits(_cfg())
    assert adm.download_rank("honest") == 2 and adm.download_rank("staller") == 2
    for r in range(adm.newcomers.established_after):
        adm.admit([_received("honest", _payload(_rollouts(tok, task, seed=20 + r), tok, task), limits)], ROUND + r)
        if r + 1 < adm.newcomers.established_after:
            assert adm.download_rank("honest") == 1
    assert adm.download_rank("honest") == 0 and adm.download_rank("staller") == 2
