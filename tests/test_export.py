"""`swarm-node export` and `swarm-node eval` of a state dir: the trained weights leave the node intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from swarm_node import cli
from swarm_node.config import LoraConfig
from swarm_node.models.factory import PRESETS, build_model, build_tokenizer
from swarm_node.models.loading import load_model
from swarm_node.node.checkpoint import (
    WEIGHTS_FILE,
    list_checkpoints,
    load_trained_model,
    model_record,
    save_checkpoint,
)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    tok = build_tokenizer()
    model = build_model(PRESETS["tiny-s"], len(tok), tok.pad_token_id, tok.eos_token_id, seed=5)
    path = tmp_path_factory.mktemp("export") / "base"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _trained_state_dir(base_dir: Path, state_dir: Path, lora: LoraConfig | None, seed: int = 0):
    """A state dir as a node leaves it: the base model perturbed (as training would), then checkpointed."""
    loaded = load_model(str(base_dir), dtype="float32", device="cpu", lora=lora)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in loaded.model.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    save_checkpoint(state_dir, 1, loaded.model, {"optimizer": {}}, {"model_name": "base"}, "fp")
    with torch.no_grad():  # round 2: what export must pick (the newest)
        for _, p in loaded.model.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    save_checkpoint(state_dir, 2, loaded.model, {"optimizer": {}}, model_record(loaded, lora), "fp")
    return loaded


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


IDS = list(range(3, 40))


def _main(*argv: str) -> int:
    return cli.main(list(argv))


def test_checkpoint_weights_are_safetensors(base_dir, tmp_path):
    _trained_state_dir(base_dir, tmp_path, None)
    ck = list_checkpoints(tmp_path)[-1]
    assert (ck.path / WEIGHTS_FILE).is_file() and not (ck.path / "model.pt").exists()
    assert ck.meta["model_path"] == str(base_dir.resolve()) and ck.meta["lora"] is None


def test_export_full_model_loads_with_from_pretrained(base_dir, tmp_path, capsys):
    trained = _trained_state_dir(base_dir, tmp_path / "state", None)
    assert _main("export", str(tmp_path / "state"), "--out", str(tmp_path / "out")) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert torch.equal(_logits(model, IDS), _logits(trained.model.eval(), IDS))
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    assert not torch.equal(_logits(base, IDS), _logits(model, IDS))  # the trained weights, not the base
    rec = json.loads((tmp_path / "out" / "swarm_node_export.json").read_text())
    assert rec["round"] == 2 and rec["kind"] == "model"
    # a second export into a non-empty directory is refused, and --merge-lora on a full model too
    capsys.readouterr()
    assert _main("export", str(tmp_path / "state"), "--out", str(tmp_path / "out")) == 2
    assert _main("export", str(tmp_path / "state"), "--out", str(tmp_path / "o2"), "--merge-lora") == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("swarm-node")]
    assert len(err) == 2 and "not an empty directory" in err[0] and "drop --merge-lora" in err[1]


def test_export_lora_adapter_and_merged(base_dir, tmp_path):
    lora = LoraConfig(enabled=True, r=4, alpha=8.0)
    trained = _trained_state_dir(base_dir, tmp_path / "state", lora)
    want = _logits(trained.model.eval(), IDS)
    assert _main("export", str(tmp_path / "state"), "--out", str(tmp_path / "adapter")) == 0
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    adapter = AutoModelForCausalLM.from_pretrained(tmp_path / "adapter")  # base + adapter via transformers' peft
    assert torch.allclose(_logits(adapter, IDS), want, atol=1e-5)
    assert _main("export", str(tmp_path / "state"), "--out", str(tmp_path / "merged"), "--merge-lora") == 0
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert torch.allclose(_logits(merged, IDS), want, atol=1e-5)
    assert not any("lora" in n for n, _ in merged.named_parameters())


def test_load_trained_model_falls_back_past_a_truncated_checkpoint(base_dir, tmp_path):
    _trained_state_dir(base_dir, tmp_path, None)
    (tmp_path / "ckpt-00000002" / WEIGHTS_FILE).write_bytes(b"cut short")
    with pytest.raises(Exception, match="does not record its base model"):
        load_trained_model(tmp_path)  # round 1 was written without the model record (an old node)


def test_eval_state_dir_equals_eval_of_export(base_dir, tmp_path, capsys):
    _trained_state_dir(base_dir, tmp_path / "state", None)
    assert _main("export", str(tmp_path / "state"), "--out", str(tmp_path / "out")) == 0
    capsys.readouterr()
    results = []
    for model in (tmp_path / "state", tmp_path / "out"):
        assert _main("eval", "--model", str(model), "--split", "ood", "--n", "40", "--json") == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["accuracy"] == results[1]["accuracy"] and results[0]["reward_mean"] == results[1]["reward_mean"]


def test_neither_model_nor_state_dir_is_one_line(tmp_path, capsys):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "readme.txt").write_text("hello")
    assert _main("eval", "--model", str(junk), "--n", "2") == 2
    assert _main("export", str(junk), "--out", str(tmp_path / "o")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err  # nothing but the two error lines
    assert "not a model directory" in err[0] and "not a node state dir" in err[1]


@pytest.mark.slow  # eight in-process evals of a model (~30 s)
def test_eval_encodes_prompts_as_the_node_did(base_dir, tmp_path, capsys):
    """A state dir's recorded chat template and prompt cap are used; flags override; a model dir gets auto."""
    templated = tmp_path / "templated"
    loaded = load_model(str(base_dir), dtype="float32", device="cpu")
    loaded.model.save_pretrained(templated)
    loaded.tokenizer.chat_template = "{{ messages[0]['content'] }}{{ messages[0]['content'] }}"  # doubles the prompt
    loaded.tokenizer.save_pretrained(templated)

    def run(*argv: str) -> dict:
        assert _main("eval", *argv, "--n", "24", "--json") == 0, capsys.readouterr().err
        return json.loads(capsys.readouterr().out)

    assert run("--model", str(templated))["chat_template"] == "on"  # auto: the tokenizer's template
    assert run("--model", str(templated), "--chat-template", "off")["chat_template"] == "off"
    assert run("--model", str(base_dir))["chat_template"] == "off"  # no template to apply
    state = tmp_path / "state"
    again = load_model(str(templated), dtype="float32", device="cpu")
    record = model_record(again, None) | {"prompt_encoding": {"chat_template": "off", "max_prompt_tokens": 3}}
    save_checkpoint(state, 1, again.model, {"optimizer": {}}, record, "fp")
    got = run("--model", str(state))
    assert got["chat_template"] == "off" and got["max_prompt_tokens"] == 3  # as the node encoded
    assert run("--model", str(state), "--chat-template", "on")["chat_template"] == "on"
    # scored on what the model says under the node's encoding: answers are its greedy completions of the
    # last 3 prompt tokens, so that encoding scores 1.0 and plain text (or the template) scores less
    from swarm_node.generation.prompts import PromptEncoder
    from swarm_node.tasks.arithmetic import ArithmeticTask

    enc = PromptEncoder(again.tokenizer, "off", 3)
    rows = []
    for p in ArithmeticTask().eval_prompts("id", 24):
        seq = enc.encode(p.text)
        out = []
        with torch.no_grad():
            for _ in range(6):
                nxt = int(again.model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
                if nxt == again.tokenizer.eos_token_id:
                    break
                out.append(nxt)
                seq.append(nxt)
        rows.append({"prompt": p.text, "answer": again.tokenizer.decode(out, skip_special_tokens=True)})
    data = tmp_path / "echo.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    files = ("--task", "files", "--data-path", str(train), "--eval-data-path", str(data), "--max-new-tokens", "6")
    assert run("--model", str(state), *files)["accuracy"] == 1.0
    assert run("--model", str(state), *files, "--max-prompt-tokens", "1024")["accuracy"] < 1.0
    assert _main("eval", "--model", str(base_dir), "--chat-template", "on", "--n", "2") == 2
    assert "no chat template" in capsys.readouterr().err
