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
    assert n["tiny-m"] >= 2 * n["tiny-s"], n


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_warmed_up_accuracy_is_partial(presets_dir, name):
    meta = json.loads((presets_dir / name / PRESET_META_FILE).read_text())
    assert 0.15 <= meta["eval_id_accuracy"] <= 0.60, meta
    assert meta["lr_full"] == PRESETS[name].lr_full and meta["lr_lora"] == PRESETS[name].lr_lora
    # The saved checkpoint scores what the factory measured (same greedy routine as `swarm-node eval`).
    lm = load_model(str(presets_dir / name), device="cpu")
    task = ArithmeticTask()
    acc = greedy_accuracy(lm.model, lm.tokenizer, task, task.eval_prompts("id", 200))
    assert acc == pytest.approx(meta["eval_id_accuracy"], abs=0.02)


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
