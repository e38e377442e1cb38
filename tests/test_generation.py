"""TransformersGenerator against a plain teacher-forced forward pass on a tiny random model.

The model is saved with save_pretrained and loaded back through `load_model`, the path every real
checkpoint takes. Behaviour log-probs must be exactly what the token was sampled from, because F-TIS
divides by them.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from swarm_node.config import GenerationConfig
from swarm_node.errors import UserFacingError
from swarm_node.generation import make_generator
from swarm_node.generation.hf import TransformersGenerator, completion_text
from swarm_node.models.factory import PRESETS, build_model, build_tokenizer
from swarm_node.models.loading import load_model

TEXTS = ["12+7=", "3-15=", "98+99=", "1=", "40-4="]  # different lengths: left padding is exercised


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    tok = build_tokenizer()
    model = build_model(PRESETS["tiny-s"], len(tok), tok.pad_token_id, tok.eos_token_id, seed=1)
    path = tmp_path_factory.mktemp("tiny") / "model"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return load_model(str(path), dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def prompts(loaded):
    return [loaded.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def make_gen(loaded, batch_size: int = 64) -> TransformersGenerator:
    tok = loaded.tokenizer
    return TransformersGenerator(loaded.model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                 batch_size=batch_size)


@torch.no_grad()
def teacher_forced(model, prompt: list[int], completion: np.ndarray, temperature: float) -> np.ndarray:
    """log_softmax(logits / T) at the completion tokens, one unpadded sequence, no cache."""
    ids = torch.tensor([list(prompt) + completion.tolist()])
    logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    n = len(completion)
    rows = lp[len(prompt) - 1 : len(prompt) - 1 + n]
    return rows.gather(-1, torch.as_tensor(completion).unsqueeze(-1)).squeeze(-1).numpy()


@torch.no_grad()
def reference_greedy(model, prompt: list[int], max_new_tokens: int, eos: int) -> list[int]:
    """Step-by-step argmax with a full forward of the whole sequence each step (no cache, no padding)."""
    seq, out = list(prompt), []
    for _ in range(max_new_tokens):
        nxt = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
        out.append(nxt)
        seq.append(nxt)
        if nxt == eos:
            break
    return out


def check_eos_invariants(samples, eos: int, max_new_tokens: int) -> None:
    for s in samples:
        assert s.token_ids.dtype == np.int64 and s.logprobs.dtype == np.float32
        assert len(s.token_ids) == len(s.logprobs)
        assert np.all(np.isfinite(s.logprobs)) and np.all(s.logprobs <= 1e-6)
        hits = np.flatnonzero(s.token_ids == eos)
        if s.finished:
            assert hits.tolist() == [len(s.token_ids) - 1], "EOS is the last token and appears once"
            assert len(s.token_ids) <= max_new_tokens
        else:
            assert hits.size == 0
            assert len(s.token_ids) == max_new_tokens


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_teacher_forcing(loaded, prompts, temperature):
    model = loaded.model
    out = make_gen(loaded).generate(prompts, 3, max_new_tokens=8, temperature=temperature, seed=123)
    assert len(out) == len(prompts) and all(len(group) == 3 for group in out)
    model.eval()
    worst = 0.0
    for prompt, group in zip(prompts, out, strict=True):
        check_eos_invariants(group, loaded.tokenizer.eos_token_id, 8)
        for s in group:
            ref = teacher_forced(model, prompt, s.token_ids, temperature)
            worst = max(worst, float(np.abs(ref - s.logprobs).max()))
    assert worst <= 1e-4


def test_greedy_logprobs_are_at_temperature_one(loaded, prompts):
    out = make_gen(loaded).generate(prompts, 1, max_new_tokens=6, temperature=0.5, greedy=True)
    loaded.model.eval()
    for prompt, (s,) in zip(prompts, out, strict=True):
        np.testing.assert_allclose(s.logprobs, teacher_forced(loaded.model, prompt, s.token_ids, 1.0), atol=1e-4)


def test_padded_batch_equals_single_prompts_and_uncached_argmax(loaded, prompts):
    eos = loaded.tokenizer.eos_token_id
    gen = make_gen(loaded)
    batched = gen.generate(prompts, 2, max_new_tokens=8, greedy=True)
    loaded.model.eval()
    for prompt, group in zip(prompts, batched, strict=True):
        (alone,) = gen.generate([prompt], 1, max_new_tokens=8, greedy=True)
        ref = reference_greedy(loaded.model, prompt, 8, eos)
        for s in group:
            assert s.token_ids.tolist() == alone[0].token_ids.tolist() == ref
            np.testing.assert_allclose(s.logprobs, alone[0].logprobs, atol=1e-5)
            assert s.finished == (ref[-1] == eos)


def test_small_batch_size_gives_same_greedy_results(loaded, prompts):
    big = make_gen(loaded, batch_size=64).generate(prompts, 3, max_new_tokens=8, greedy=True)
    small = make_gen(loaded, batch_size=2).generate(prompts, 3, max_new_tokens=8, greedy=True)
    for g_big, g_small in zip(big, small, strict=True):
        for a, b in zip(g_big, g_small, strict=True):
            assert a.token_ids.tolist() == b.token_ids.tolist() and a.finished == b.finished
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_seed_makes_sampling_reproducible(loaded, prompts):
    gen = make_gen(loaded, batch_size=4)

    def flat(out):
        return [s.token_ids.tolist() for group in out for s in group]

    a = gen.generate(prompts, 4, max_new_tokens=8, seed=7)
    b = gen.generate(prompts, 4, max_new_tokens=8, seed=7)
    c = gen.generate(prompts, 4, max_new_tokens=8, seed=8)
    assert flat(a) == flat(b)
    for x, y in zip(a, b, strict=True):
        for s, t in zip(x, y, strict=True):
            np.testing.assert_array_equal(s.logprobs, t.logprobs)
    assert flat(a) != flat(c)
    assert len({tuple(s.token_ids.tolist()) for s in a[0]}) > 1, "G samples of one prompt should differ"


@pytest.fixture
def forced_eos(loaded):
    """Make EOS impossible before absolute position P and certain from P on (changes every forward)."""
    eos, threshold = loaded.tokenizer.eos_token_id, 6

    def hook(module, args, kwargs, output):
        logits = output.logits
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = torch.arange(kwargs["input_ids"].shape[1]).unsqueeze(0)
        pos = pos[:, -logits.shape[1] :]
        logits[..., eos] = torch.where(pos >= threshold, 1e4, -1e4).to(logits.dtype)
        return output

    handle = loaded.model.register_forward_hook(hook, with_kwargs=True)
    yield threshold
    handle.remove()


@pytest.mark.parametrize("greedy", [True, False])
def test_eos_stops_a_sample_and_max_new_tokens_cuts_the_rest(loaded, forced_eos, greedy):
    tok = loaded.tokenizer
    ps = [tok(t, add_special_tokens=False)["input_ids"] for t in ["1=", "12+7=", "98+99="]]  # lengths 2, 5, 6
    max_new = 4
    out = make_gen(loaded).generate(ps, 2, max_new_tokens=max_new, greedy=greedy, seed=3)
    for prompt, group in zip(ps, out, strict=True):
        # the token predicted at position len(prompt)-1+t is EOS once that position reaches the threshold
        stop_at = forced_eos - (len(prompt) - 1)
        for s in group:
            if stop_at < max_new:
                assert s.finished and len(s.token_ids) == stop_at + 1
                assert s.token_ids[-1] == tok.eos_token_id
                assert abs(float(s.logprobs[-1])) < 1e-4  # EOS had probability ~1
                assert completion_text(tok, s) == tok.decode(s.token_ids[:-1].tolist())
            else:
                assert not s.finished and len(s.token_ids) == max_new
        check_eos_invariants(group, tok.eos_token_id, max_new)
    assert [g[0].finished for g in out] == [False, True, True]


def test_generate_restores_training_mode(loaded, prompts):
    loaded.model.train()
    make_gen(loaded).generate(prompts[:1], 1, max_new_tokens=2, greedy=True)
    assert loaded.model.training
    loaded.model.eval()
    make_gen(loaded).generate(prompts[:1], 1, max_new_tokens=2, greedy=True)
    assert not loaded.model.training


def test_bad_arguments_are_refused(loaded, prompts):
    gen = make_gen(loaded)
    with pytest.raises(ValueError):
        gen.generate(prompts, 1, max_new_tokens=2, temperature=0.0)
    with pytest.raises(ValueError):
        gen.generate([[]], 1, max_new_tokens=2)


def test_make_generator_transformers(loaded):
    gen = make_generator(loaded, GenerationConfig(backend="transformers", batch_size=5))
    assert isinstance(gen, TransformersGenerator) and gen.batch_size == 5
    assert gen.eos_token_id == loaded.tokenizer.eos_token_id
    gen.sync_weights(loaded.model)  # no-op: the generator samples from the training model itself


def test_vllm_missing_extra_is_a_clear_error(loaded, monkeypatch):
    from swarm_node.generation.vllm_backend import VLLMGenerator

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, installed or not
    with pytest.raises(UserFacingError, match=r"swarm-node\[vllm\]"):
        VLLMGenerator("unused", eos_token_id=1)
    with pytest.raises(UserFacingError, match="not installed"):
        make_generator(loaded, GenerationConfig(backend="vllm"))


def test_hf_weights_fold_lora_into_plain_checkpoint_names(loaded, prompts):
    """What the vLLM backend pushes after a step: a peft model's weights with the adapter merged in."""
    from peft import LoraConfig, get_peft_model

    from swarm_node.generation.vllm_backend import hf_weights

    tok = loaded.tokenizer
    base = build_model(PRESETS["tiny-s"], len(tok), tok.pad_token_id, tok.eos_token_id, seed=1)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # non-zero adapter
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    plain = build_model(PRESETS["tiny-s"], len(tok), tok.pad_token_id, tok.eos_token_id, seed=2)
    weights = dict(hf_weights(peft_model))
    assert set(weights) == set(plain.state_dict())
    plain.load_state_dict(weights)
    for n, p in peft_model.named_parameters():
        assert torch.equal(p, before[n]), "hf_weights must not modify the model"
    ids = torch.tensor([prompts[0]])
    peft_model.eval()
    plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, peft_model(input_ids=ids).logits,
                                   atol=1e-4, rtol=1e-4)
