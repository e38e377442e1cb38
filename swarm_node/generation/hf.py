"""transformers backend: batched sampling with a KV cache, on CPU or GPU.

A hand-written decode loop (instead of `model.generate`) so the log-prob recorded for each token is the
full-vocabulary log-softmax at the sampling temperature, i.e. the distribution actually sampled from.
Prompts are left-padded; position ids come from the attention mask so padding does not shift them.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from swarm_node.generation.base import Generator, Sample
from swarm_node.generation.stops import stop_id_list

# transformers >= 5.x renamed `past_key_values` to `cache` (the old name warns, then goes away in 5.40).
_CACHE_KW = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


MIN_SHARED_PREFIX = 8  # tokens: a shorter common prefix is not worth a forward of its own


def _forward_kwargs(model: Any) -> set[str]:
    """Names the underlying model's forward accepts (a peft wrapper forwards **kwargs to it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(inspect.signature(base.forward).parameters)


class TransformersGenerator(Generator):
    def __init__(self, model: Any, *, eos_token_id: int | Sequence[int], pad_token_id: int, batch_size: int = 64):
        """`eos_token_id`: one stop id or several (`generation.stops.stop_token_ids`); the first is "the" EOS."""
        self.model = model
        stops = stop_id_list(eos_token_id, "eos_token_id")
        self.eos_token_id = stops[0]
        self.stop_token_ids = stops
        self.pad_token_id = int(pad_token_id)
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        # Only the last position's logits are needed: skips a (batch, prompt_len, vocab) tensor at prefill.
        self._extra: dict[str, Any] = {"logits_to_keep": 1} if "logits_to_keep" in _forward_kwargs(model) else {}

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _sample(self, prompts: list[list[int]], num_generations: int, *, max_new_tokens: int, temperature: float,
                greedy: bool, seed: int | None) -> list[list[Sample]]:
        flat = [list(p) for p in prompts for _ in range(num_generations)]
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(int(seed))
        out: list[Sample] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(flat), self.batch_size):
                chunk = flat[start : start + self.batch_size]
                out.extend(self._generate_batch(chunk, max_new_tokens, temperature, greedy, gen))
        finally:
            if was_training:
                self.model.train()
        return [out[i * num_generations : (i + 1) * num_generations] for i in range(len(prompts))]

    def _prefill(self, prompts: list[list[int]], share: bool) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Run the prompts -> (last logits [n, V] fp32, KV cache, attention mask [n, L], last position ids [n, 1]).

        Prompts are left-padded. When they share a prefix of at least MIN_SHARED_PREFIX tokens (every chat
        prompt starts with the template's system turn), the prefix runs once and its cache is repeated
        for each prompt; the rest of each prompt (left-padded, so the pads sit between the prefix and the
        rest, masked out and skipped by the position ids) runs on top. The result is the same rows a
        whole-prompt prefill gives, for a fraction of the compute on short questions behind a long template.
        """
        dev, n = self.device, len(prompts)
        shared = min(_common_prefix(prompts), min(len(p) for p in prompts) - 1) if share and n > 1 else 0
        cache, head_mask, offset = None, torch.zeros((n, 0), dtype=torch.long, device=dev), 0
        if shared >= MIN_SHARED_PREFIX:
            prefix = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=dev)
            out = self.model(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True,
                             position_ids=torch.arange(shared, device=dev)[None], **{_CACHE_KW: None},
                             **self._extra)
            cache = getattr(out, _CACHE_KW)
            if not hasattr(cache, "batch_repeat_interleave"):  # an old transformers' tuple cache: no sharing
                cache, shared = None, 0
            else:
                cache.batch_repeat_interleave(n)
                head_mask, offset = torch.ones((n, shared), dtype=torch.long, device=dev), shared
        rests = [p[offset:] for p in prompts]
        width = max(len(p) for p in rests)
        ids = torch.full((n, width), self.pad_token_id, dtype=torch.long, device=dev)
        rest_mask = torch.zeros((n, width), dtype=torch.long, device=dev)
        for i, p in enumerate(rests):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long, device=dev)
            rest_mask[i, width - len(p) :] = 1
        positions = offset + (rest_mask.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([head_mask, rest_mask], dim=-1)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         **{_CACHE_KW: cache}, **self._extra)
        return out.logits[:, -1, :].float(), getattr(out, _CACHE_KW), mask, positions[:, -1:]

    @torch.no_grad()
    def _generate_batch(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float,
        greedy: bool,
        gen: torch.Generator | None,
        share: bool = True,
    ) -> list[Sample]:
        dev = self.device
        b = len(prompts)
        # Each distinct prompt is prefilled once (a group's G copies share it); its KV cache and last logits
        # are then indexed out to the copies, so sampling sees exactly the rows a copy-per-row prefill gives.
        owner, uniq = _distinct(prompts) if share else (list(range(b)), prompts)
        tokens = torch.full((b, max_new_tokens), self.pad_token_id, dtype=torch.long, device=dev)
        logps = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=dev)
        lengths = torch.zeros(b, dtype=torch.long, device=dev)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        stops = torch.tensor(self.stop_token_ids, dtype=torch.long, device=dev)
        logits, cache, mask, step_pos = self._prefill(uniq, share)
        if len(uniq) < b and not hasattr(cache, "batch_select_indices"):  # an old transformers' tuple cache
            return self._generate_batch([list(p) for p in prompts], max_new_tokens, temperature, greedy, gen,
                                        share=False)
        index = torch.tensor(owner, dtype=torch.long, device=dev)
        if len(uniq) < b:
            cache.batch_select_indices(index)
        logits, mask, step_pos = logits[index], mask[index], step_pos[index]
        for t in range(max_new_tokens):
            if greedy:  # behaviour log-probs of greedy decoding are reported at T=1
                logprobs_all = torch.log_softmax(logits, dim=-1)
                nxt = logits.argmax(dim=-1)
            else:
                logprobs_all = torch.log_softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(logprobs_all.exp(), 1, generator=gen).squeeze(-1)
            nxt = torch.where(done, torch.full_like(nxt, self.pad_token_id), nxt)
            tokens[:, t] = nxt
            logps[:, t] = logprobs_all.gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
            lengths += (~done).long()
            done = done | torch.isin(nxt, stops)
            if bool(done.all()) or t + 1 == max_new_tokens:
                break
            step_pos = step_pos + 1
            mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=dev)], dim=-1)
            outputs = self.model(
                input_ids=nxt.unsqueeze(-1), attention_mask=mask, position_ids=step_pos, use_cache=True,
                **{_CACHE_KW: cache}, **self._extra,
            )
            cache = getattr(outputs, _CACHE_KW)
            logits = outputs.logits[:, -1, :].float()
        tokens_np = tokens.cpu().numpy()
        logps_np = logps.cpu().numpy()
        lengths_np = lengths.cpu().numpy()
        samples = []
        for i in range(b):
            n = int(lengths_np[i])
            tok = tokens_np[i, :n].astype(np.int64)
            samples.append(
                Sample(
                    token_ids=tok,
                    logprobs=logps_np[i, :n].astype(np.float32),
                    finished=bool(n > 0 and int(tok[-1]) in self.stop_token_ids),
                )
            )
        return samples


def _common_prefix(prompts: list[list[int]]) -> int:
    """Length of the longest prefix all prompts share (the chat template's system turn, a few-shot prefix)."""
    first, n = prompts[0], min(len(p) for p in prompts)
    for k in range(n):
        if any(p[k] != first[k] for p in prompts[1:]):
            return k
    return n


def _distinct(prompts: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """(row -> index of its prompt among the distinct ones, the distinct prompts in first-seen order)."""
    slot: dict[tuple[int, ...], int] = {}
    owner = [slot.setdefault(tuple(p), len(slot)) for p in prompts]
    return owner, [list(p) for p in slot]


def completion_text(tokenizer: Any, sample: Sample) -> str:
    """Decoded completion without the EOS token or other special tokens."""
    return tokenizer.decode(sample.token_ids.tolist(), skip_special_tokens=True)
