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

# transformers >= 5.x renamed `past_key_values` to `cache` (the old name warns, then goes away in 5.40).
_CACHE_KW = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def _forward_kwargs(model: Any) -> set[str]:
    """Names the underlying model's forward accepts (a peft wrapper forwards **kwargs to it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(inspect.signature(base.forward).parameters)


class TransformersGenerator(Generator):
    def __init__(self, model: Any, *, eos_token_id: int | Sequence[int], pad_token_id: int, batch_size: int = 64):
        """`eos_token_id`: one stop id or several (`generation.stops.stop_token_ids`); the first is "the" EOS."""
        self.model = model
        stops = [int(t) for t in (eos_token_id if isinstance(eos_token_id, Sequence) else [eos_token_id])]
        if not stops:
            raise ValueError("eos_token_id must name at least one stop token")
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

    def generate(
        self,
        prompts: list[list[int]],
        num_generations: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | None = None,
    ) -> list[list[Sample]]:
        if not greedy and not temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
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

    @torch.no_grad()
    def _generate_batch(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float,
        greedy: bool,
        gen: torch.Generator | None,
    ) -> list[Sample]:
        dev = self.device
        b = len(prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((b, width), self.pad_token_id, dtype=torch.long, device=dev)
        mask = torch.zeros((b, width), dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long, device=dev)
            mask[i, width - len(p) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        tokens = torch.full((b, max_new_tokens), self.pad_token_id, dtype=torch.long, device=dev)
        logps = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=dev)
        lengths = torch.zeros(b, dtype=torch.long, device=dev)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        stops = torch.tensor(self.stop_token_ids, dtype=torch.long, device=dev)
        cache = None
        step_ids, step_pos = ids, positions
        for t in range(max_new_tokens):
            outputs = self.model(
                input_ids=step_ids, attention_mask=mask, position_ids=step_pos, use_cache=True,
                **{_CACHE_KW: cache}, **self._extra,
            )
            cache = getattr(outputs, _CACHE_KW)
            logits = outputs.logits[:, -1, :].float()
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
            if bool(done.all()):
                break
            step_ids = nxt.unsqueeze(-1)
            step_pos = step_pos[:, -1:] + 1
            mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=dev)], dim=-1)
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


def completion_text(tokenizer: Any, sample: Sample) -> str:
    """Decoded completion without the EOS token or other special tokens."""
    return tokenizer.decode(sample.token_ids.tolist(), skip_special_tokens=True)
