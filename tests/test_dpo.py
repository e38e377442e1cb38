"""DPO loss, preference data, and gossip averaging with the real encode/validate/combine code (fast)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from swarm_node import dpo as A
from swarm_node.dpo import topology as T
from swarm_node.errors import UserFacingError
from swarm_node.swarm.averaging import payload
from swarm_node.tasks.preferences import PreferencePair, SyntheticPreferences, load_preference_file, split_hh
from swarm_node.training.dpo import (
    DPOTrainer,
    HeldOut,
    dpo_loss,
    pair_logps,
    sequence_logps,
    tokenize_pairs,
)
from swarm_node.training.params import trainable_named


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run ~10x faster on one thread than on 2 busy cores."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tok():
    from swarm_node.models.factory import build_tokenizer

    return build_tokenizer()


def tiny_model(tok, seed: int = 0, hidden: int = 32):
    from swarm_node.models.factory import Preset, build_model

    pre = Preset("llama", hidden=hidden, layers=2, heads=2, kv_heads=2, intermediate=2 * hidden,
                 lr_full=1e-3, lr_lora=1e-3)
    return build_model(pre, len(tok), tok.pad_token_id, tok.eos_token_id, seed)


# ---------------------------------------------------------------- loss


def test_dpo_loss_matches_hand_computation() -> None:
    pc, pr = torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0])
    rc, rr = torch.tensor([-1.5, -2.0]), torch.tensor([-1.5, -2.0])
    loss, margin = dpo_loss(pc, pr, rc, rr, beta=0.1)
    m = [0.1 * ((-1 + 1.5) - (-2 + 1.5)), 0.1 * ((-3 + 2) - (-1 + 2))]  # 0.1, -0.2
    assert margin.tolist() == pytest.approx(m)
    expected = np.mean([math.log1p(math.exp(-x)) for x in m])
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_logps_mask_the_prompt(tok) -> None:
    model = tiny_model(tok)
    pairs = [PreferencePair("12A=", "abc", "efg"), PreferencePair("a much longer prompt: 7B=", "x", "yz")]
    data = tokenize_pairs(tok, pairs)
    # response mask = response chars + EOS; prompt positions are excluded
    assert data.chosen_resp.sum(1).tolist() == [4, 2]
    assert data.rejected_resp.sum(1).tolist() == [4, 3]
    assert not data.chosen_resp[1, : len(pairs[1].prompt)].any()
    with torch.no_grad():
        got = sequence_logps(model, data.chosen_ids, data.chosen_attn, data.chosen_resp)
        logp = torch.log_softmax(model(input_ids=data.chosen_ids, attention_mask=data.chosen_attn).logits, -1)
    for i, p in enumerate(pairs):
        start, end = len(p.prompt), len(p.prompt) + len(p.chosen) + 1
        manual = sum(logp[i, t - 1, data.chosen_ids[i, t]].item() for t in range(start, end))
        assert got[i].item() == pytest.approx(manual, abs=1e-4)
    # changing the prompt changes the context, but the count of summed tokens stays the response's
    c, r = pair_logps(model, data)
    assert c.shape == r.shape == (2,)


def test_dpo_steps_raise_heldout_accuracy(tok) -> None:
    task = SyntheticPreferences(4)
    model = tiny_model(tok)
    pairs = [p for u in range(4) for p in task.user_pairs(u, 64)]
    trainer = DPOTrainer(model, tok, pairs, beta=0.1, lr=3e-3, batch_size=16)
    held = HeldOut(model, tok, task.heldout_pairs(200))
    before = held.evaluate(model)
    stats = trainer.local_steps(25)
    after = held.evaluate(model)
    # policy == reference at the start: every margin is exactly 0, so none counts as correct (margin > 0)
    assert before["heldout_pref_acc"] == 0.0 and before["heldout_dpo_loss"] == pytest.approx(math.log(2))
    assert after["heldout_pref_acc"] > 0.9
    assert after["heldout_dpo_loss"] < 0.5 and stats.loss < math.log(2)


def test_dpo_lora_trains_adapter_only(tok) -> None:
    from swarm_node.config import LoraConfig
    from swarm_node.models.loading import wrap_lora

    model = wrap_lora(tiny_model(tok), LoraConfig(enabled=True, r=4, target_modules=["q_proj", "v_proj"]))
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    task = SyntheticPreferences(4)
    DPOTrainer(model, tok, task.user_pairs(0, 32), lr=1e-2, batch_size=8).local_steps(3)
    for n, p in model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, base_before[n])
    fp_r4 = A.arch_fingerprint(model)
    fp_r8 = A.arch_fingerprint(wrap_lora(tiny_model(tok), LoraConfig(enabled=True, r=8,
                                                                     target_modules=["q_proj", "v_proj"])))
    assert fp_r4 != fp_r8
    assert A.arch_fingerprint(tiny_model(tok, seed=1)) == A.arch_fingerprint(tiny_model(tok, seed=2))
    assert A.arch_fingerprint(tiny_model(tok, hidden=48)) != A.arch_fingerprint(tiny_model(tok))


# ---------------------------------------------------------------- preference data


def test_synthetic_task_is_non_iid() -> None:
    task = SyntheticPreferences(4)
    assert [task.liked(u) for u in range(4)] == ["abcd", "cdef", "efgh", "ghab"]
    p0 = task.user_pairs(0, 50)
    assert all(set(p.chosen) <= set("abcd") and set(p.rejected) <= set("efgh") for p in p0)
    assert task.user_pairs(0, 5) == task.user_pairs(0, 5)
    users = {p.user for p in task.heldout_pairs(200)}
    assert users == {0, 1, 2, 3}


def test_hh_split() -> None:
    chosen = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: joke?\n\nAssistant: Why did the chicken..."
    rejected = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: joke?\n\nAssistant: No."
    prompt, c, r = split_hh(chosen, rejected)
    assert prompt == "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: joke?\n\nAssistant:"
    assert c == " Why did the chicken..." and r == " No."
    with pytest.raises(ValueError):
        split_hh("\n\nHuman: a", "\n\nHuman: b")


def test_load_preference_file(tmp_path) -> None:
    f = tmp_path / "prefs.jsonl"
    hh = {"chosen": "\n\nHuman: q\n\nAssistant: good", "rejected": "\n\nHuman: q\n\nAssistant: bad"}
    f.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n\n" + json.dumps(hh) + "\n")
    pairs = load_preference_file(f)
    assert pairs[0] == PreferencePair("p", "a", "b")
    assert pairs[1] == PreferencePair("\n\nHuman: q\n\nAssistant:", " good", " bad")

    cases = {
        '{"prompt": "p", "chosen": "a"}': "missing key 'rejected'",
        '{"prompt": "p", "chosen": 3, "rejected": "b"}': "'chosen' must be a non-empty string",
        "not json": "line 2",
        '["a"]': "expected a JSON object",
        '{"chosen": "x y", "rejected": "x z"}': "Assistant",
    }
    for bad, needle in cases.items():
        f.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n" + bad + "\n")
        with pytest.raises(UserFacingError) as exc:
            load_preference_file(f)
        assert str(f) in str(exc.value) and "line 2" in str(exc.value) and needle in str(exc.value)
    f.write_text("")
    with pytest.raises(UserFacingError, match="empty"):
        load_preference_file(f)
    with pytest.raises(UserFacingError, match="not found"):
        load_preference_file(tmp_path / "nope.jsonl")


# ---------------------------------------------------------------- averaging


def _simulate_gossip(states: list[list[torch.Tensor]], graph: str, rounds: int, compression: str,
                     fp: str = "f" * 16) -> list[float]:
    """Synchronous gossip through real bytes; returns the consensus error sqrt(sum_i ||x_i - x_bar||^2)."""
    n = len(states)
    ids = [f"peer-{i:02d}" for i in range(n)]
    adj = T.adjacency(graph, n)
    shapes = [t.shape for t in states[0]]

    def error(ss: list[list[torch.Tensor]]) -> float:
        mean = [torch.stack([s[k] for s in ss]).mean(0) for k in range(len(shapes))]
        return sum(A.params_sq_distance(s, mean) for s in ss) ** 0.5

    errs = [error(states)]
    for _ in range(rounds):
        blobs = {ids[i]: A.encode_params(states[i], fp, compression) for i in range(n)}
        states = [A.gossip_step(ids[i], blobs[ids[i]], blobs, ids, adj, shapes, fp, compression).params
                  for i in range(n)]
        errs.append(error(states))
    return errs


def _random_states(n: int, seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(17, 5, generator=g), torch.randn(40, generator=g)] for _ in range(n)]


@pytest.mark.parametrize("graph", ["ring", "torus", "path", "star", "exponential"])
def test_consensus_contracts_at_the_spectral_rate(graph: str) -> None:
    n = 8
    rho = 1.0 - T.spectral_gap(T.mixing_matrix(graph, n))
    errs = _simulate_gossip(_random_states(n), graph, rounds=12, compression="none")
    ratios = [b / a for a, b in zip(errs, errs[1:], strict=False)]
    assert all(r <= rho + 1e-4 for r in ratios)  # never slower than the worst-case rate
    late = (errs[-1] / errs[6]) ** (1 / 6)  # after transients the slowest mode dominates
    assert late == pytest.approx(rho, abs=0.05)


def test_complete_beats_ring_and_compression_keeps_contracting() -> None:
    n = 8
    ring = _simulate_gossip(_random_states(n), "ring", rounds=5, compression="float16")
    full = _simulate_gossip(_random_states(n), "complete", rounds=5, compression="float16")
    assert full[1] < 1e-2 * full[0]  # W = J/n: one round reaches consensus, up to fp16 rounding
    assert 0.1 * ring[0] < ring[5] < 0.5 * ring[0]
    q8 = _simulate_gossip(_random_states(n), "ring", rounds=5, compression="uint8")
    assert q8[5] < 0.45 * q8[0]


def test_missing_neighbour_reweighting_is_doubly_stochastic() -> None:
    n, gone = 8, 3
    ids = [f"p{i}" for i in range(n)]
    for graph in ("ring", "torus", "exponential", "star"):
        adj = T.adjacency(graph, n)
        w = np.zeros((n, n))
        for i in range(n):
            if i == gone:
                w[i, i] = 1.0
                continue
            for peer, v in A.live_mixing_row(adj, ids, ids[i], [ids[gone]]).items():
                w[i, ids.index(peer)] = v
        assert np.allclose(w, w.T) and np.allclose(w.sum(0), 1) and np.allclose(w.sum(1), 1)
        assert (w >= 0).all() and w[gone, :].sum() == 1.0


def test_gossip_with_a_missing_neighbour_goes_on() -> None:
    n = 6
    ids = [f"peer-{i}" for i in range(n)]
    states = _random_states(n)
    fp = "a" * 16
    blobs = {p: A.encode_params(s, fp, "none") for p, s in zip(ids, states, strict=True)}
    adj = T.adjacency("ring", n)
    received = dict(blobs)
    received[ids[1]] = None
    res = A.gossip_step(ids[0], blobs[ids[0]], received, ids, adj, [t.shape for t in states[0]], fp, "none")
    assert res.missing == [ids[1]] and res.present == [ids[5]]
    assert sum(res.weights.values()) == pytest.approx(1.0)
    expected = [res.weights[ids[0]] * a + res.weights[ids[5]] * b for a, b in zip(states[0], states[5], strict=True)]
    assert all(torch.allclose(x, y) for x, y in zip(res.params, expected, strict=True))


def test_hostile_payloads_are_rejected() -> None:
    fp = "b" * 16
    good = [torch.randn(4, 3), torch.randn(5)]
    shapes = [t.shape for t in good]
    for comp in ("none", "float16", "uint8"):
        blob = A.encode_params(good, fp, comp)
        out = A.decode_params(blob, shapes, fp, comp)
        assert all(torch.allclose(a, b, atol=0.1) for a, b in zip(out, good, strict=True))

    def reason(blob: object, comp: str = "float16", **kw) -> str:
        with pytest.raises(A.PayloadError) as exc:
            A.decode_params(blob, shapes, fp, comp, **kw)  # type: ignore[arg-type]
        return exc.value.reason

    nan = [torch.full((4, 3), float("nan")), torch.randn(5)]
    assert reason(A.encode_params(nan, fp, "none"), "none") == "not_finite"
    assert reason(A.encode_params([torch.randn(3, 4), torch.randn(5)], fp)) == "wrong_shape"
    assert reason(A.encode_params([torch.randn(4, 3)], fp)) == "wrong_count"
    assert reason(A.encode_params(good, "c" * 16)) == "arch_mismatch"
    assert reason(A.encode_params(good, fp, "none")) == "bad_encoding"
    blob = A.encode_params(good, fp)
    assert reason(blob[:-3]) == "truncated"
    assert reason(blob + b"x") == "trailing_bytes"
    assert reason(b"\x00" * 64) == "bad_header"
    assert reason(b"SN") == "truncated"
    assert reason("text") == "type"
    assert reason(blob, max_bytes=10) == "too_large"
    # a well-formed header followed by garbage protobuf
    head = blob[: payload._HEADER.size]
    assert reason(head + payload._LEN.pack(5) + b"\xff\xff\xff\xff\xff" + payload._LEN.pack(0)) in {"bad_proto", "bad_encoding"}
    # the payload passes through gossip_step as a counted rejection, not an exception
    ids = ["a", "b", "c"]
    rejects = A.RejectCounter()
    res = A.gossip_step("a", blob, {"b": blob[:-1], "c": b"junk"}, ids, T.adjacency("ring", 3), shapes, fp,
                        rejects=rejects)
    assert res.missing == ["b", "c"] and res.weights == {"a": 1.0}
    assert sum(rejects.counts.values()) == 2


def test_averaging_beats_local_training_on_the_mixture(tok) -> None:
    """8 nodes, 4 users (2 nodes each), ring gossip: the consensus learns every user's taste.

    One local step per round: with 4 steps the nodes drift back to their own user's taste between
    averages (client drift) and the mixture accuracy stays near chance on this task (docs/dpo.md).
    """
    task = SyntheticPreferences(4)
    n, rounds, local_steps = 8, 24, 1
    ids = [f"peer-{i}" for i in range(n)]
    models = [tiny_model(tok, seed=0) for _ in range(n)]  # common initial model, like the swarm
    held = HeldOut(models[0], tok, task.heldout_pairs(200))
    trainers = [DPOTrainer(m, tok, task.user_pairs(i % 4, 128, seed=i), lr=3e-3, batch_size=16, seed=i)
                for i, m in enumerate(models)]
    solo = tiny_model(tok, seed=0)
    solo_tr = DPOTrainer(solo, tok, task.user_pairs(0, 128, seed=0), lr=3e-3, batch_size=16, seed=0)
    fp = A.arch_fingerprint(models[0])
    adj = T.adjacency("ring", n)
    shapes = [p.shape for _, p in trainable_named(models[0])]
    dists = []
    for _ in range(rounds):
        for t in trainers:
            t.local_steps(local_steps)
        solo_tr.local_steps(local_steps)
        blobs = {ids[i]: A.encode_params(A.get_params(m), fp, "float16") for i, m in enumerate(models)}
        results = [A.gossip_step(ids[i], blobs[ids[i]], blobs, ids, adj, shapes, fp, "float16") for i in range(n)]
        for m, r in zip(models, results, strict=True):
            A.set_params(m, r.params)
        dists.append(float(np.mean([r.consensus_distance for r in results])))
    gossip_acc = float(np.mean([held.evaluate(m)["heldout_pref_acc"] for m in models]))
    solo_acc = held.evaluate(solo)["heldout_pref_acc"]
    assert gossip_acc > 0.7
    assert solo_acc < 0.65
    assert gossip_acc > solo_acc + 0.15
    assert dists[-1] < dists[0]


def test_run_dpo_node_alone_writes_metrics(tok, tmp_path) -> None:
    """No swarm: the same loop runs local DPO only and writes one metrics line per round."""
    from swarm_node.config import load_config
    from swarm_node.dpo.round import run_dpo_node

    model_dir = tmp_path / "model"
    tiny_model(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    cfg = load_config(None, ["mode=dpo", f"model.path={model_dir}", "rounds=3", "dpo.user=2", "dpo.lr=0.003",
                             "dpo.pairs_per_user=32", "dpo.heldout_pairs=40", "metrics.eval_every=2"])
    assert run_dpo_node(cfg, tmp_path / "state", log_level="warning") == 0
    rows = [json.loads(line) for line in (tmp_path / "state" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2]
    need = {"round", "dpo_loss", "heldout_pref_acc", "consensus_distance", "bytes_sent", "bytes_received", "graph",
            "spectral_gap", "neighbours", "missing_neighbours"}
    assert need <= set(rows[0])
    assert rows[0]["user"] == 2 and rows[0]["neighbours"] == [] and rows[0]["bytes_sent"] == 0
    assert rows[0]["model"]["path"] == str(model_dir) and "model" not in rows[1]  # the round-0 row names the model
    assert rows[1]["heldout_pref_acc"] is None and rows[2]["heldout_pref_acc"] is not None  # eval_every=2, last


@pytest.mark.parametrize("when", ["during_round", "after_evaluation"])
def test_sigterm_at_any_point_ends_on_an_evaluated_round(tok, tmp_path, monkeypatch, when: str) -> None:
    """SIGTERM in the middle of round 1, or after round 1 was evaluated: exit 0, and the last row is evaluated.

    The second case is the race a live node hit: a signal after the evaluate decision but before the loop
    looked at the flag ended the run on a row with no held-out accuracy.
    """
    import os
    import signal

    from swarm_node.config import load_config
    from swarm_node.dpo import round as dpo_round
    from swarm_node.node.metrics import MetricsWriter

    model_dir = tmp_path / "model"
    tiny_model(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    cfg = load_config(None, ["mode=dpo", f"model.path={model_dir}", "dpo.pairs_per_user=16",
                             "dpo.heldout_pairs=16", "metrics.eval_every=100"])
    assert cfg.rounds is None  # only the signal ends this run
    hook_round = dpo_round.DPONode.run_round if when == "during_round" else MetricsWriter.write

    def signalling(self, *args, **kwargs):
        if when == "during_round" and self.last_round + 1 == 1:  # while round 1 runs
            os.kill(os.getpid(), signal.SIGTERM)
        out = hook_round(self, *args, **kwargs)
        if when == "after_evaluation" and args[0]["round"] == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(dpo_round.DPONode if when == "during_round" else MetricsWriter,
                        "run_round" if when == "during_round" else "write", signalling)
    handler_before = signal.getsignal(signal.SIGTERM)
    assert dpo_round.run_dpo_node(cfg, tmp_path / "state", log_level="warning") == 0
    assert signal.getsignal(signal.SIGTERM) is handler_before  # the caller's handler is back
    rows = [json.loads(line) for line in (tmp_path / "state" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == ([0, 1] if when == "during_round" else [0, 1, 2])
    assert rows[-1]["heldout_pref_acc"] is not None
    assert all(r["heldout_pref_acc"] is None for r in rows[1:-1])


def test_bf16_parameters_are_cast_before_compressing(tok) -> None:
    model = tiny_model(tok).to(torch.bfloat16)
    fp = A.arch_fingerprint(model)
    params = A.get_params(model)
    assert all(t.dtype == torch.float32 for t in params)
    blob = A.encode_params(params, fp, "float16")  # hivemind's Float16Compression refuses bf16 itself
    out = A.decode_params(blob, [t.shape for t in params], fp, "float16")
    A.set_params(model, out)
    assert next(model.parameters()).dtype == torch.bfloat16


def test_federated_step_is_bit_identical_on_every_node() -> None:
    fp, n = "d" * 16, 5
    ids = [f"peer-{i}" for i in range(n)]
    states = _random_states(n, seed=4)
    shapes = [t.shape for t in states[0]]
    blobs = {p: A.encode_params(s, fp, "float16") for p, s in zip(ids, states, strict=True)}
    participants = ids[1:4]  # S = 3 sampled; peer-0 and peer-4 adopt their mean
    results = [A.federated_step(p, blobs[p], blobs, participants, shapes, fp) for p in ids]
    assert len({A.params_digest(r.params) for r in results}) == 1
    mean = [torch.stack([states[i][k] for i in (1, 2, 3)]).mean(0) for k in range(len(shapes))]
    assert all(torch.allclose(a, b, atol=2e-3) for a, b in zip(results[0].params, mean, strict=True))
    partial = A.federated_step("peer-0", blobs["peer-0"], {"peer-1": blobs["peer-1"]}, participants, shapes, fp)
    assert partial.missing == ["peer-2", "peer-3"] and partial.weights == {"peer-1": 1.0}
