"""Tiny offline presets: determinism, reload paths, shared tokenizer, partial skill, LoRA, load errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from swarm_node.config import LoraConfig
from swarm_node.errors import UserFacingError
from swarm_node.evaluation import greedy_accuracy
from swarm_node.models.factory import PRESETS, build_tiny, build_tokenizer
from swarm_node.models.loading import PRESET_META_FILE, load_model, tokenizer_fingerprint
from swarm_node.tasks.arithmetic import ArithmeticTask


def _weights(path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


@pytest.mark.slow  # builds a preset (a short warm-up, still 5-30 s)
def test_same_seed_gives_identical_weights(tmp_path):
    a = build_tiny("tiny-s", tmp_path / "a", seed=3, max_steps=12)
    b = build_tiny("tiny-s", tmp_path / "b", seed=3, max_steps=12)
    build_tiny("tiny-s", tmp_path / "c", seed=4, max_steps=12)
    assert a["warmup_steps"] == b["warmup_steps"] == 12
    wa, wb, wc = _weights(tmp_path / "a"), _weights(tmp_path / "b"), _weights(tmp_path / "c")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert any(not torch.equal(wa[k], wc[k]) for k in wa), "another seed should give other weights"


@pytest.mark.slow  # builds a preset (a short warm-up, still 5-30 s)
def test_build_uses_fixed_threads_and_restores_them(tmp_path, monkeypatch):
    """The build runs on BUILD_THREADS torch threads whatever the caller set, and gives the caller's back."""
    import swarm_node.models.factory as factory
    from swarm_node.models.presets import BUILD_THREADS

    seen = []
    real = factory._warm_up
    monkeypatch.setattr(factory, "_warm_up", lambda *a, **k: (seen.append(torch.get_num_threads()), real(*a, **k))[1])
    prev = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        meta = build_tiny("tiny-s", tmp_path / "a", seed=3, max_steps=3)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(prev)
    assert seen == [BUILD_THREADS] and meta["build_threads"] == BUILD_THREADS


@pytest.mark.slow  # builds a preset (a short warm-up, still 5-30 s)
def test_same_seed_same_bytes_whatever_the_callers_threads(tmp_path):
    """Reproducible presets: equal weights files (sha256 recorded in the meta) for 1 and 2 caller threads."""
    import hashlib

    prev = torch.get_num_threads()
    metas = []
    try:
        for i, threads in enumerate((1, 2)):
            torch.set_num_threads(threads)
            metas.append(build_tiny("tiny-s", tmp_path / str(i), seed=3, max_steps=12))
    finally:
        torch.set_num_threads(prev)
    assert metas[0]["sha256"] == metas[1]["sha256"]
    assert metas[0]["sha256"] == hashlib.sha256((tmp_path / "0" / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.slow  # builds a preset (a short warm-up, still 5-30 s)
@pytest.mark.parametrize("target, steps, stop", [(0.0, 4, "target"), (1.01, 9, "max steps")])
def test_warm_up_stops_on_train_split_accuracy(tmp_path, monkeypatch, target, steps, stop):
    """The first train-split check at the target stops the warm-up, else the cap does; held-out never steers."""
    import dataclasses

    import swarm_node.models.factory as factory

    monkeypatch.setitem(factory.PRESETS, "tiny-s", dataclasses.replace(
        PRESETS["tiny-s"], warmup_target_val=target, warmup_check_every=4))
    scored: list[list[str]] = []
    real = factory.greedy_accuracy
    monkeypatch.setattr(factory, "greedy_accuracy",
                        lambda m, t, task, prompts, **kw: scored.append([p.id for p in prompts]) or real(m, t, task, prompts, **kw))
    meta = build_tiny("tiny-s", tmp_path / "a", seed=3, max_steps=9)
    assert (meta["warmup_steps"], meta["warmup_stop"], meta["warmup_max_steps"]) == (steps, stop, 9)
    assert meta["warmup_target_val_accuracy"] == target
    assert (meta["warmup_val_accuracy"] >= target) == (stop == "target")
    # checks at 4 (and 8, 9 without a stop), then the final id and ood scores: the only held-out passes
    checks, finals = scored[:-2], scored[-2:]
    assert len(checks) == (1 if stop == "target" else 3)
    task = ArithmeticTask()
    assert finals == [[p.id for p in task.eval_prompts(s, 200)] for s in ("id", "ood")]
    held = {p.id for s in ("id", "ood") for p in task.eval_prompts(s, 200)}
    assert all(not held.intersection(c) for c in checks)
    # a fixed stop (`warmup_steps`, for benchmarks) ignores the target, on the same schedule
    fixed = build_tiny("tiny-s", tmp_path / "b", seed=3, warmup_steps=9)
    assert (fixed["warmup_steps"], fixed["warmup_stop"], fixed["warmup_target_val_accuracy"]) == (9, "fixed steps", None)


def test_presets_have_vllm_cpu_head_dims():
    """vLLM's CPU attention refuses head_dim 16; 32 and 64 are kernels it ships."""
    for name, p in PRESETS.items():
        assert p.hidden % p.heads == 0 and p.head_dim in (32, 64, 128), (name, p.head_dim)
        assert p.heads % p.kv_heads == 0


@pytest.mark.slow  # builds a preset (a short warm-up, still 5-30 s)
def test_stale_cached_preset_is_rebuilt(tmp_path, monkeypatch):
    import swarm_node.models.factory as factory

    built = []
    real = factory.build_tiny
    monkeypatch.setattr(factory, "build_tiny", lambda name, out, **kw: built.append(name) or real(name, out, max_steps=2, **kw))
    target = factory.ensure_preset("tiny-s", tmp_path)
    assert built == ["tiny-s"]
    assert factory.ensure_preset("tiny-s", tmp_path) == target and built == ["tiny-s"]  # cached
    meta = json.loads((target / PRESET_META_FILE).read_text())
    (target / PRESET_META_FILE).write_text(json.dumps({**meta, "factory_version": 1}))
    factory.ensure_preset("tiny-s", tmp_path)
    assert built == ["tiny-s", "tiny-s"]  # an older recipe is rebuilt, not reused
    assert json.loads((target / PRESET_META_FILE).read_text())["factory_version"] == factory.FACTORY_VERSION


def test_presets_reload_through_transformers(presets_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in PRESETS:
        path = presets_dir / name
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        assert model.config.model_type == PRESETS[name].arch
        ids = tok("12+7=", add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == "12+7="
        assert tok.eos_token_id is not None and tok.pad_token_id is not None
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits
        assert logits.shape == (1, len(ids), len(tok))


def test_presets_load_through_load_model(presets_dir):
    for name in PRESETS:
        lm = load_model(name, presets_dir=presets_dir, device="cpu")
        assert lm.name == name and not lm.is_lora
        assert lm.dtype == torch.float32
        assert lm.meta["preset"] == name
        assert lm.default_lr() == PRESETS[name].lr_full


def test_presets_share_one_tokenizer(presets_dir):
    fps = {name: load_model(name, presets_dir=presets_dir, device="cpu").tokenizer_fp for name in PRESETS}
    assert len(set(fps.values())) == 1, fps
    assert set(fps.values()) == {tokenizer_fingerprint(build_tokenizer())}


def test_preset_sizes(presets_dir):
    n = {name: json.loads((presets_dir / name / PRESET_META_FILE).read_text())["parameters"] for name in PRESETS}
    assert 100_000 <= n["tiny-s"] < n["tiny-m"] <= 1_000_000, n


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_warmed_up_accuracy_is_partial(presets_dir, name):
    meta = json.loads((presets_dir / name / PRESET_META_FILE).read_text())
    assert 0.20 <= meta["eval_id_accuracy"] <= 0.40, meta
    # The adaptive stop held: the first train-split check at the target stopped it, or the cap did.
    preset = PRESETS[name]
    assert meta["warmup_max_steps"] == preset.warmup_max_steps
    assert 0 < meta["warmup_steps"] <= preset.warmup_max_steps, meta
    if meta["warmup_stop"] == "target":
        assert meta["warmup_val_accuracy"] >= preset.warmup_target_val, meta
        assert meta["warmup_steps"] % preset.warmup_check_every == 0, meta
    else:
        assert meta["warmup_stop"] == "max steps" and meta["warmup_steps"] == preset.warmup_max_steps, meta
    assert meta["lr_full"] == PRESETS[name].lr_full and meta["lr_lora"] == PRESETS[name].lr_lora
    # The saved checkpoint scores what the factory measured (same greedy routine as `swarm-node eval`).
    lm = load_model(str(presets_dir / name), device="cpu")
    task = ArithmeticTask()
    acc = greedy_accuracy(lm.model, lm.tokenizer, task, task.eval_prompts("id", 200))
    assert acc == pytest.approx(meta["eval_id_accuracy"], abs=0.02)
    # ood (a leading "+" on held-out problems) is below the ceiling and below id for both presets. It is
    # not asserted off the floor: on CI's AVX-512/AMX Xeon (2026-12-02, n=200) the v4 tiny-s scores 0.01 ood
    # at id 0.32 (the v3 build 0.015 there, 0.085 on the CPU the v3 docs were measured on), tiny-m 0.115:
    # tiny-s ood gains are not measurable on every CPU (docs/results/learning.md).
    ood = greedy_accuracy(lm.model, lm.tokenizer, task, task.eval_prompts("ood", 200))
    assert ood == pytest.approx(meta["eval_ood_accuracy"], abs=0.02)
    assert ood <= 0.40 and ood < meta["eval_id_accuracy"], (ood, meta)


def test_lora_trains_only_adapter(presets_dir):
    lm = load_model("tiny-s", presets_dir=presets_dir, device="cpu", lora=LoraConfig(enabled=True, r=4))
    assert lm.is_lora
    trainable = [n for n, p in lm.model.named_parameters() if p.requires_grad]
    frozen = [n for n, p in lm.model.named_parameters() if not p.requires_grad]
    assert trainable and frozen
    assert all("lora_" in n for n in trainable), trainable
    assert lm.default_lr() == PRESETS["tiny-s"].lr_lora


def test_missing_local_path_is_user_facing(tmp_path):
    with pytest.raises(UserFacingError, match="not a directory"):
        load_model(str(tmp_path / "no-such-model"), device="cpu")


def test_unreachable_hub_id_says_how_to_pass_local_path(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserFacingError) as info:
        load_model("swarm-node-test/definitely-not-a-model", device="cpu")
    msg = str(info.value)
    assert "local directory" in msg and "model.path" in msg


@pytest.mark.slow  # builds a preset (a short warm-up, still 5-30 s)
def test_make_model_command(tmp_path, monkeypatch, capsys):
    import swarm_node.models.factory as factory
    from swarm_node.cli import main

    real = factory.build_tiny
    monkeypatch.setattr(factory, "build_tiny", lambda *a, **kw: real(*a, max_steps=5, **kw))
    out = tmp_path / "m"
    assert main(["make-model", "--preset", "tiny-s", "--out", str(out), "--seed", "1", "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["preset"] == "tiny-s" and meta["seed"] == 1 and meta["warmup_steps"] == 5
    assert json.loads((out / PRESET_META_FILE).read_text()) == meta

    assert main(["make-model", "--preset", "tiny-s", "--out", str(tmp_path / "t")]) == 0
    text = capsys.readouterr().out
    assert "warm-up step 5" in text and "built tiny-s" in text and "parameters" in text


@pytest.mark.slow
def test_preset_hash_reaches_metrics_and_report(presets_dir, tmp_path):
    from swarm_node.config import NodeConfig
    from swarm_node.grpo.round import run_grpo_node
    from swarm_node.node.metrics import read_metrics
    from swarm_node.runs.report import write_report

    meta = json.loads((presets_dir / "tiny-s" / PRESET_META_FILE).read_text())
    cfg = NodeConfig.model_validate({"rounds": 1, "model": {"path": "tiny-s"},
                                     "task": {"prompts_per_round": 2, "eval_n": 4},
                                     "generation": {"num_generations": 2, "max_new_tokens": 3}})
    state = tmp_path / "run" / "alone" / "tiny-s"
    assert run_grpo_node(cfg, state) == 0
    row0 = read_metrics(state / "metrics.jsonl")[0]
    assert row0["round"] == 0 and row0["model"]["sha256"] == meta["sha256"] and row0["model"]["preset"] == "tiny-s"
    report = write_report(tmp_path / "run")
    assert report["arms"]["alone"]["tiny-s"]["model"]["sha256"] == meta["sha256"]


@pytest.mark.slow
def test_dpo_preset_hash_reaches_metrics_and_report(presets_dir, tmp_path):
    """DPO's round 0 already trains; its row still records the preset's weights hash, as GRPO's does."""
    from swarm_node.config import load_config
    from swarm_node.dpo.round import run_dpo_node
    from swarm_node.node.metrics import read_metrics
    from swarm_node.runs.report import write_report

    meta = json.loads((presets_dir / "tiny-m" / PRESET_META_FILE).read_text())
    cfg = load_config(None, ["mode=dpo", "model.path=tiny-m", "rounds=2", "dpo.user=1", "dpo.pairs_per_user=8",
                             "dpo.heldout_pairs=8", "dpo.batch_size=4"])
    state = tmp_path / "tiny-m"
    assert run_dpo_node(cfg, state, log_level="warning") == 0
    rows = read_metrics(state / "metrics.jsonl")
    assert rows[0]["round"] == 0 and rows[0]["model"]["sha256"] == meta["sha256"]
    assert rows[0]["model"]["preset"] == "tiny-m" and "model" not in rows[1]
    report = write_report(state)  # a node's state dir: one arm ("node") of one peer
    assert report["arms"]["node"]["tiny-m"]["model"]["sha256"] == meta["sha256"]
