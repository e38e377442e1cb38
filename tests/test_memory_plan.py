"""Measured memory on CPU: the log-prob path at a 151,936 vocabulary, gradient checkpointing, and
`swarm-node plan` against measured peaks at three sizes, fp32 and bf16.

Each measurement runs in a fresh process (a peak is a process's high-water mark) with glibc's mmap threshold
fixed, so freed tensors leave the resident set (planning/measure.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _child(code: str, *args: str, timeout: float = 600) -> dict:
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                         env=ENV, cwd=ROOT, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


LOGPROB_PATH = """
    import json, sys, numpy as np, torch
    from swarm_node.planning.measure import PeakMeter, synthetic_groups
    meter = PeakMeter("cpu")
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from swarm_node.config import TrainingConfig
    from swarm_node.training.ftis import ftis_loss
    from swarm_node.training.ftis_step import FTISTrainer
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=151936, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=128, tie_word_embeddings=True))
    groups = synthetic_groups(2, 8, 16, 64, 151936)
    trainer = FTISTrainer(model, TrainingConfig(micro_batch_tokens=10**6), 0, temperature=0.7)
    batch = trainer.prepare(groups)
    seqs = batch.sequences

    def old_path():
        # the log-prob path before training/logprobs.py: the model's logits at every completion position, an fp32
        # copy of them, divided by T, log-softmax
        b, cmax, pmax = len(seqs), max(s.completion_len for s in seqs), max(s.prompt_len for s in seqs)
        ids = torch.zeros((b, pmax + cmax), dtype=torch.long)
        attn = torch.zeros_like(ids)
        rows, js, tg = [], [], []
        for r, s in enumerate(seqs):
            ids[r, pmax - s.prompt_len : pmax + s.completion_len] = torch.from_numpy(s.ids)
            attn[r, pmax - s.prompt_len : pmax + s.completion_len] = 1
            rows.append(torch.full((s.completion_len,), r)); js.append(torch.arange(s.completion_len))
            tg.append(torch.from_numpy(s.ids[s.prompt_len:]))
        row, j, target = torch.cat(rows), torch.cat(js), torch.cat(tg)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0),
                       logits_to_keep=cmax + 1).logits[:, -(cmax + 1):-1]
        sel = logits[row, j].float() / 0.7
        lp = sel.gather(-1, target[:, None]).squeeze(-1) - torch.logsumexp(sel, dim=-1)
        logp = torch.zeros((b, cmax)).index_put((row, j), lp)
        mask = torch.zeros((b, cmax), dtype=torch.bool).index_put((row, j), torch.tensor(True))
        beh = torch.zeros((b, cmax)).index_put((row, j), torch.cat([torch.from_numpy(s.behaviour) for s in seqs]))
        adv = torch.tensor([s.advantage for s in seqs])
        loss, _ = ftis_loss(logp, beh, mask, adv, variant="ftis", normalizer=1.0)
        loss.backward()
        return [logp[r, : s.completion_len].detach().numpy() for r, s in enumerate(seqs)]

    meter.reset()
    if sys.argv[1] == "old":
        got = old_path()
    else:
        trainer.accumulate_gradients(batch)
        got = [x for g in trainer.completion_logprobs(groups) for x in g]
    print(json.dumps({"peak": meter.peak(), "tokens": int(sum(s.completion_len for s in seqs)),
                      "logprobs": [float(v) for x in got for v in x]}))
"""


def test_the_log_prob_path_at_a_151936_vocabulary_peaks_at_least_4x_lower_with_equal_logprobs():
    old = _child(LOGPROB_PATH, "old")
    new = _child(LOGPROB_PATH, "new")
    assert old["tokens"] == new["tokens"] == 1024
    one_copy = 1024 * 151936 * 4  # one fp32 [tokens x vocabulary]
    assert old["peak"] > 3 * one_copy  # what the old path held: several fp32 copies of [tokens x vocabulary]
    assert new["peak"] * 4 <= old["peak"], (new["peak"] / 2**20, old["peak"] / 2**20)
    diff = max(abs(a - b) for a, b in zip(old["logprobs"], new["logprobs"], strict=True))
    assert diff < 1e-4, diff


BUILD = """
    import sys, torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from swarm_node.models.factory import build_tokenizer
    hidden, layers, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.manual_seed(0)
    heads = hidden // 64
    Qwen2ForCausalLM(Qwen2Config(vocab_size=32000, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                 num_key_value_heads=2 if heads % 2 == 0 else 1, intermediate_size=4 * hidden,
                                 tie_word_embeddings=True, max_position_embeddings=512)).save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    print("{}")
"""

# a round of 4 prompts x 8 completions of 32 + 64 tokens: three micro-batches of at most 1024 tokens, so a later
# one's activations sit beside the whole gradient, as the plan's bound assumes
ROUND = ["task.prompts_per_round=4", "generation.num_generations=8", "generation.max_prompt_tokens=32",
         "generation.max_new_tokens=64", "training.micro_batch_tokens=1024", "training.lr=1e-5"]


SIZES = (256, 384, 512)  # hidden widths of the 8-layer models: 16M, 29M and 47M parameters


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Random-init 8-layer Qwen2-shaped models (vocabulary 32,000), saved once for the module's tests."""
    root = tmp_path_factory.mktemp("plan-models")
    out = {}
    for hidden in SIZES:
        out[hidden] = root / f"q{hidden}x8"
        _child(BUILD, str(hidden), "8", str(out[hidden]))
    return out


def _plan_measured(model: Path, *overrides: str) -> dict:
    args = [sys.executable, "-m", "swarm_node.cli", "plan", "--device", "cpu", "--measure", "--json",
            "--set", f"model.path={model}", *[x for o in (*ROUND, *overrides) for x in ("--set", o)]]
    res = subprocess.run(args, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_gradient_checkpointing_lowers_the_measured_peak_of_an_8_layer_model_and_recomputes(models):
    model = models[512]
    plain = _plan_measured(model)
    ckpt = _plan_measured(model, "training.gradient_checkpointing=true")
    assert plain["measured"]["layer_recomputations"] == 0
    m = ckpt["measured"]
    # every checkpointed layer forward (8 layers x the micro-batches of two steps) ran again in the backward
    assert m["layer_forwards"] >= 8 * 2 * 2 and m["layer_recomputations"] == m["layer_forwards"]
    assert m["peak_gib"] < 0.9 * plain["measured"]["peak_gib"], (m["peak_gib"], plain["measured"]["peak_gib"])
    assert ckpt["train_gib"]["activations"] < plain["train_gib"]["activations"] / 4


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_plan_is_within_20_percent_of_measured_peaks_at_three_sizes(models, dtype):
    ratios = {}
    for hidden in SIZES:
        out = _plan_measured(models[hidden], f"model.dtype={dtype}")
        ratios[hidden] = out["train_peak_gib"] / out["measured"]["peak_gib"]
    assert all(0.8 <= r <= 1.2 for r in ratios.values()), ratios
