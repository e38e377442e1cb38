"""One GRPO / F-TIS training round on local and peer groups: advantages, log-prob recompute, loss, step.

Memory follows the tokens: a micro-batch holds at most ``micro_batch_tokens`` padded tokens, the output head
runs on completion positions only, a chunk of tokens at a time, in fp32, recomputed in the backward pass
(training/logprobs.py), and ``gradient_checkpointing`` keeps only each layer's input (training/checkpointing.py).
Out of memory halves the token budget and retries the step. Each micro-batch's loss is a *sum* over its kept
sequences; after all micro-batches the gradient is divided by the global kept count, so the update equals the
full-batch loss gradient whatever the micro-batching.

The F-TIS loss itself is training/ftis.py; what a step takes and reports (`PreparedBatch`, `StepResult`) is
training/step_results.py; the model's parts it finds (its body and output head, the forward's arguments)
are training/model_parts.py.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from swarm_node.config import TrainingConfig
from swarm_node.training.checkpointing import LayerCheckpointing, frozen_cache
from swarm_node.training.ftis import LossDiagnostics, ftis_loss, group_advantages
from swarm_node.training.groups import TrainGroup
from swarm_node.training.logprobs import chunk_tokens, head_logprobs, logits_logprobs
from swarm_node.training.model_parts import (
    body_and_head,
    eval_mode,
    forward_names,
    release_cached_memory,
    shared_prefix,
    vocab_size,
)
from swarm_node.training.optim import build_optimizer, set_lr
from swarm_node.training.params import trainable_parameters
from swarm_node.training.step_results import (
    PassStats,
    PreparedBatch,
    StepResult,
    TrainSequence,
    collect_pass,
    fill_first_pass,
    token_mean,
)

log = logging.getLogger(__name__)

MIN_SHARED_PREFIX = 8  # tokens all prompts of a micro-batch share before that prefix gets a forward of its own
DEFAULT_LR = 1e-6  # paper's full-model lr; used only when neither cfg.lr nor a preset default is given


class FTISTrainer:
    """Owns the optimizer and applies F-TIS (or a baseline variant) to lists of TrainGroup.

    The model must already be on ``device``. Works for full models and peft LoRA models alike: only
    parameters with requires_grad are optimized and clipped. ``checkpoint_layers`` (the model's transformer
    layers) switches on activation checkpointing; ``compute_dtype`` float16 switches on dynamic loss scaling
    (bf16 and fp32 need none). ``share_prompts`` False runs one whole forward per sequence instead of one
    forward per distinct prompt (the reference the shared forward is tested against).
    """

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainingConfig,
        pad_token_id: int,
        device: torch.device | str | None = None,
        lr_default: float | None = None,
        temperature: float = 1.0,
        checkpoint_layers: Sequence[nn.Module] = (),
        compute_dtype: torch.dtype | None = None,
        share_prompts: bool = True,
    ) -> None:
        self.model = model
        # log pi_theta is taken at the sampling temperature (logits / T, as TRL and verl do), so that our own
        # samples, whose behaviour log-probs were taken at T, are exactly on-policy: ratio 1 at any T.
        self.temperature = float(temperature)
        self.cfg = cfg
        self.pad_token_id = int(pad_token_id)
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.params = trainable_parameters(model)
        self.lr = cfg.lr if cfg.lr is not None else (lr_default if lr_default is not None else DEFAULT_LR)
        self.optimizer = build_optimizer(self.params, cfg.optimizer, self.lr, cfg.weight_decay)
        self.steps_done = 0
        self.token_budget = cfg.micro_batch_tokens  # halved when a step runs out of memory
        self.checkpointing = LayerCheckpointing(checkpoint_layers) if checkpoint_layers else None
        self.scaler = (torch.amp.GradScaler(self.device.type) if compute_dtype == torch.float16 else None)
        self._keep_name: str | None = None  # the forward's logits_to_keep argument, found on first use
        self._cache_in_name: str | None = None  # the forward's KV-cache argument, found on first use
        # one forward per distinct prompt when the model takes a KV cache; False: one whole forward per sequence
        # (the reference the shared forward is tested against); off for good once a cache could not be made
        # read-only under checkpointing
        self._share_ok = share_prompts
        self._body, self._head = body_and_head(model)
        vocab = getattr(getattr(self._head, "weight", None), "shape", (0,))[0] or vocab_size(model)
        self.logits_chunk = cfg.logits_chunk_tokens or chunk_tokens(vocab)

    # ---- data -------------------------------------------------------------------------------------

    def prepare(self, groups: list[TrainGroup]) -> PreparedBatch:
        """Group advantages (over the whole group, filtered members included), selection, flattening."""
        batch = PreparedBatch(sequences=[])
        for g in groups:
            if self.cfg.variant == "on_policy" and not g.is_local:
                batch.groups_dropped_external += 1
                continue
            adv = group_advantages(torch.from_numpy(g.rewards), self.cfg.adv_eps).numpy()
            if self.cfg.skip_zero_advantage_groups and not np.any(adv != 0):
                batch.groups_zero_advantage += 1
                continue
            if g.is_local:
                batch.groups_local += 1
            else:
                batch.groups_external += 1
            for comp, beh, a in zip(g.completions, g.behaviour_logprobs, adv, strict=True):
                if comp.size == 0:
                    batch.empty_completions += 1
                    continue
                ids = np.concatenate([g.prompt_ids, comp])
                batch.sequences.append(TrainSequence(ids, len(g.prompt_ids), beh, float(a), g.is_local))
        return batch

    def _micro_batches(self, n: int, seqs: list[TrainSequence]) -> list[list[int]]:
        """Indices grouped by prompt, then by similar length (less padding, and a group's completions share
        one prompt forward), cut so that the tokens each micro-batch's forwards run stay within the token
        budget (a longer sequence runs alone); the order does not change the result.

        The tokens a forward runs: distinct prompts x the longest prompt + rows x the longest completion when
        prompts are shared, rows x (longest prompt + longest completion) when every row runs whole."""
        order = sorted(range(n), key=lambda i: (seqs[i].prompt_len, seqs[i].ids[: seqs[i].prompt_len].tobytes(),
                                                len(seqs[i].ids)))
        share = self.shares_prompts()
        cap = self.cfg.micro_batch_size or n
        out: list[list[int]] = []
        cur: list[int] = []
        prompts: set[bytes] = set()
        pmax = cmax = 0
        for i in order:
            s = seqs[i]
            key = s.ids[: s.prompt_len].tobytes()
            p, c = max(pmax, s.prompt_len), max(cmax, s.completion_len)
            rows, distinct = len(cur) + 1, len(prompts | {key})
            cost = distinct * p + rows * c if share else rows * (p + c)
            if cur and (len(cur) >= cap or cost > self.token_budget):
                out.append(cur)
                cur, prompts, p, c = [], set(), s.prompt_len, s.completion_len
            cur.append(i)
            prompts.add(key)
            pmax, cmax = p, c
        if cur:
            out.append(cur)
        return out

    def _forward_logp(self, seqs: list[TrainSequence]) -> tuple[Tensor, Tensor, Tensor]:
        """Completion-aligned log pi_theta [b, Cmax] (fp32 log-softmax), mask, behaviour log-probs.

        The model's body gives the hidden states of the positions that predict completion tokens, and the
        output head (a 49k x 576 matmul on SmolLM2, ~20% of its forward) runs only on those, never on a
        prompt or padding position, a chunk at a time (training/logprobs.py). When several sequences share a
        prompt (a group's G completions) and the model can continue from a KV cache, each distinct prompt is
        run once and its keys and values are indexed out to its completions (`_forward_shared`): the
        gradient flows back through them, so the result is the same as one forward per sequence, at a
        fraction of the cost when prompts are longer than completions (chat templates). Otherwise every row
        is run whole (`_forward_rows`). A model whose head cannot run on its own (logit soft-capping or
        scaling) computes its logits itself, and only the fp32 log-softmax is chunked.
        """
        b = len(seqs)
        cmax = max(s.completion_len for s in seqs)
        mask = torch.zeros((b, cmax), dtype=torch.bool)
        beh = torch.zeros((b, cmax), dtype=torch.float32)
        rows, js, targets = [], [], []
        for r, s in enumerate(seqs):
            c = s.completion_len
            mask[r, :c] = True
            beh[r, :c] = torch.from_numpy(s.behaviour)
            rows.append(torch.full((c,), r, dtype=torch.long))
            js.append(torch.arange(c))
            targets.append(torch.from_numpy(s.ids[s.prompt_len:]))
        dev = self.device
        row, j, target = torch.cat(rows).to(dev), torch.cat(js).to(dev), torch.cat(targets).to(dev)
        prompts = {s.ids[: s.prompt_len].tobytes() for s in seqs}
        feats = None
        if len(prompts) < b and self.shares_prompts():
            feats = self._forward_shared(seqs, cmax)
        if feats is None:
            feats = self._forward_rows(seqs, cmax)
        sel = feats[row, j]  # [tokens, H] (or [tokens, V]): only the positions predicting completion tokens
        if self._head is not None:
            lp = head_logprobs(sel, target, self._head, self.temperature, self.logits_chunk)
        else:
            lp = logits_logprobs(sel, target, self.temperature, self.logits_chunk)
        logp = torch.zeros((b, cmax), dtype=torch.float32, device=dev).index_put((row, j), lp)
        return logp, mask.to(dev), beh.to(dev)

    def _run(self, keep: int, **kwargs: object) -> tuple[Tensor, object]:
        """One forward -> (the last `keep` positions' features [rows, keep, .], the output): hidden states of
        the model's body when the head runs on its own, else the model's own logits."""
        if self._head is not None:
            out = self._body(**kwargs)
            return out.last_hidden_state[:, -keep:], out
        out = self.model(**kwargs, **self._keep_kwargs(keep))
        return out.logits[:, -keep:], out

    def _forward_rows(self, seqs: list[TrainSequence], cmax: int) -> Tensor:
        """Features [b, Cmax, .] predicting each completion token, one whole row per sequence.

        Prompts are left-padded and completions right-padded, so every row's completion starts at the same
        column and the last Cmax + 1 columns, minus the last, are exactly the predicting positions. Position
        ids count real tokens only, so the padding moves nothing.
        """
        b = len(seqs)
        pmax = max(s.prompt_len for s in seqs)
        ids = torch.full((b, pmax + cmax), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((b, pmax + cmax), dtype=torch.long)
        for r, s in enumerate(seqs):
            p, c = s.prompt_len, s.completion_len
            ids[r, pmax - p : pmax + c] = torch.from_numpy(s.ids)
            attn[r, pmax - p : pmax + c] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)
        # column pmax - 1 + j predicts completion token j: the last cmax + 1 columns, minus the last
        feats, _ = self._run(cmax + 1, input_ids=ids, attention_mask=attn, position_ids=position_ids,
                             use_cache=False)
        return feats[:, :-1]

    def _forward_shared(self, seqs: list[TrainSequence], cmax: int) -> Tensor | None:
        """Features [b, Cmax, .] as `_forward_rows`, with one forward per distinct prompt (None: the cache
        could not be made read-only for checkpointing; the caller runs the rows).

        Distinct prompts (left-padded) run once with a cache, outside checkpointing (a rerun would write the
        cache twice); the last position predicts completion token 0; the cache is indexed out to the b
        sequences (a differentiable gather), made read-only, and the completions (right-padded) run on top of
        it, their first Cmax - 1 positions predicting tokens 1..Cmax-1.
        """
        dev = self.device
        slot: dict[bytes, int] = {}
        owner = [slot.setdefault(s.ids[: s.prompt_len].tobytes(), len(slot)) for s in seqs]
        uniq: list[np.ndarray] = [np.empty(0)] * len(slot)
        for s, k in zip(seqs, owner, strict=True):
            uniq[k] = s.ids[: s.prompt_len]
        with self._layers_plain():
            last, cache, p_attn = self._prompt_forward(uniq)
        index = torch.tensor(owner, dtype=torch.long, device=dev)
        cache.batch_select_indices(index)
        if not frozen_cache(cache) and self.checkpointing is not None:
            self._share_ok = False
            return None
        b = len(seqs)
        c_ids = torch.full((b, cmax), self.pad_token_id, dtype=torch.long)
        c_attn = torch.zeros((b, cmax), dtype=torch.long)
        for r, s in enumerate(seqs):
            c_ids[r, : s.completion_len] = torch.from_numpy(s.ids[s.prompt_len :])
            c_attn[r, : s.completion_len] = 1
        c_ids, c_attn = c_ids.to(dev), c_attn.to(dev)
        positions = p_attn.sum(1)[index][:, None] + torch.arange(cmax, device=dev)[None]
        first = last[index]  # [b, 1, .]
        if cmax == 1:
            return first
        rest, _ = self._run(cmax - 1, input_ids=c_ids[:, : cmax - 1],
                            attention_mask=torch.cat([p_attn[index], c_attn[:, : cmax - 1]], 1),
                            position_ids=positions[:, : cmax - 1], use_cache=True, **{self._cache_in_name: cache})
        return torch.cat([first, rest], dim=1)

    def _layers_plain(self) -> contextlib.AbstractContextManager:
        """Forwards that write a KV cache run without checkpointing (a rerun would write it twice)."""
        return self.checkpointing.paused() if self.checkpointing is not None else contextlib.nullcontext()

    def _prompt_forward(self, prompts: list[np.ndarray]) -> tuple[Tensor, object, Tensor]:
        """Run distinct prompts with a cache -> (last position's features [u, 1, .], cache, attention mask [u, L]).

        A prefix all of them share (the chat template's system turn) runs once, its cache repeated per prompt
        (differentiable, like the later gather), and the rest of each prompt runs on top, left-padded behind
        the prefix with its pads masked and skipped by the position ids.
        """
        dev, u = self.device, len(prompts)
        shared = min(shared_prefix(prompts), min(len(p) for p in prompts) - 1) if u > 1 else 0
        cache, head, offset = None, torch.zeros((u, 0), dtype=torch.long, device=dev), 0
        if shared >= MIN_SHARED_PREFIX:
            prefix = torch.from_numpy(prompts[0][:shared])[None].to(dev)
            _, first = self._run(1, input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True,
                                 position_ids=torch.arange(shared, device=dev)[None])
            cache = getattr(first, self._cache_out_name(first))
            cache.batch_repeat_interleave(u)
            head, offset = torch.ones((u, shared), dtype=torch.long, device=dev), shared
        width = max(len(p) - offset for p in prompts)
        ids = torch.full((u, width), self.pad_token_id, dtype=torch.long)
        rest = torch.zeros((u, width), dtype=torch.long)
        for k, p in enumerate(prompts):
            n = len(p) - offset
            ids[k, width - n :] = torch.from_numpy(p[offset:])
            rest[k, width - n :] = 1
        ids, rest = ids.to(dev), rest.to(dev)
        kwargs = {self._cache_in_name: cache} if cache is not None else {}
        last, out = self._run(1, input_ids=ids, attention_mask=torch.cat([head, rest], 1), use_cache=True,
                              position_ids=offset + (rest.cumsum(1) - 1).clamp(min=0), **kwargs)
        return last, getattr(out, self._cache_out_name(out)), torch.cat([head, rest], 1)

    def shares_prompts(self) -> bool:
        """Whether the model continues from a KV cache it returns: decided once per trainer from the forward's
        signature (and off for good once a cache could not be made read-only under checkpointing)."""
        if not self._share_ok:
            return False
        if self._cache_in_name is None:
            names = forward_names(self._body if self._head is not None else self.model)
            self._cache_in_name = next((k for k in ("past_key_values", "cache") if k in names), "")
        return bool(self._cache_in_name)

    @staticmethod
    def _cache_out_name(out: object) -> str:
        """The output field holding the cache (transformers 5.x: `cache`; earlier: `past_key_values`)."""
        for name in ("cache", "past_key_values"):
            if getattr(out, name, None) is not None and hasattr(getattr(out, name), "batch_select_indices"):
                return name
        raise RuntimeError("the model returned no KV cache with batch_select_indices")

    def _keep_kwargs(self, n: int) -> dict[str, int]:
        """Ask the model for its last n positions' logits only (`logits_to_keep`, transformers >= 4.50); a
        model without it computes them all."""
        if self._keep_name is None:
            self._keep_name = "logits_to_keep" if "logits_to_keep" in forward_names(self.model) else ""
        return {self._keep_name: n} if self._keep_name else {}

    @torch.no_grad()
    def completion_logprobs(self, groups: list[TrainGroup]) -> list[list[np.ndarray]]:
        """log pi_theta of every completion token, per group, micro-batched (no selection, no grad)."""
        seqs = [
            TrainSequence(np.concatenate([g.prompt_ids, c]), len(g.prompt_ids), b, 0.0, g.is_local)
            for g in groups
            for c, b in zip(g.completions, g.behaviour_logprobs, strict=True)
        ]
        out: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(seqs)
        nonempty = [i for i, s in enumerate(seqs) if s.completion_len > 0]
        with eval_mode(self.model):
            for idx in self._micro_batches(len(nonempty), [seqs[i] for i in nonempty]):
                mb = [seqs[nonempty[i]] for i in idx]
                logp, _, _ = self._forward_logp(mb)
                for i, s, row in zip(idx, mb, logp.cpu().numpy(), strict=True):
                    out[nonempty[i]] = row[: s.completion_len].copy()
        result, k = [], 0
        for g in groups:
            result.append(out[k : k + g.size])
            k += g.size
        return result

    # ---- gradients ---------------------------------------------------------------------------------

    def accumulate_gradients(self, batch: PreparedBatch, old_logp: list[Tensor] | None = None) -> PassStats:
        """Forward/backward over micro-batches; leaves the full-batch loss gradient in ``.grad``.

        ``old_logp`` (per sequence, completion-aligned) switches on the PPO clip. Gradients are zeroed
        first; when no sequence is kept they stay zero.
        """
        cfg, seqs = self.cfg, batch.sequences
        n = len(seqs)
        self.optimizer.zero_grad(set_to_none=True)
        diags: list[tuple[list[int], LossDiagnostics]] = []
        logps: list[Tensor] = [torch.empty(0)] * n
        loss_sum = 0.0
        with eval_mode(self.model):
            for idx in self._micro_batches(n, seqs):
                mb = [seqs[i] for i in idx]
                logp, mask, beh = self._forward_logp(mb)
                adv = torch.tensor([s.advantage for s in mb], dtype=torch.float32, device=self.device)
                old = None
                if old_logp is not None:
                    old = torch.zeros_like(logp)
                    for r, i in enumerate(idx):
                        old[r, : mb[r].completion_len] = old_logp[i].to(self.device)
                loss, diag = ftis_loss(
                    logp,
                    beh,
                    mask,
                    adv,
                    variant=cfg.variant,
                    cap=cfg.cap,
                    filter_threshold=cfg.filter_threshold,
                    clip_eps=cfg.clip_eps,
                    old_logp=old,
                    normalizer=1.0,
                    filter_non_positive=cfg.filter_advantage == "non_positive",
                )
                if diag.n_kept > 0:
                    (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
                loss_sum += float(loss.detach())
                detached = logp.detach()
                for r, i in enumerate(idx):
                    logps[i] = detached[r, : mb[r].completion_len].clone()
                diags.append((idx, diag))
        stats = collect_pass(n, diags, logps)
        if stats.n_kept > 0:
            for p in self.params:
                if p.grad is not None:
                    p.grad.div_(stats.n_kept)
            stats.loss = loss_sum / stats.n_kept
        return stats

    # ---- the round ---------------------------------------------------------------------------------

    def step(self, groups: list[TrainGroup], lr_default: float | None = None) -> StepResult:
        """Train on one round's groups: cfg.steps_per_round optimizer steps (PPO clip when > 1)."""
        t0 = time.perf_counter()
        cfg = self.cfg
        if cfg.lr is None and lr_default is not None and lr_default != self.lr:
            self.lr = lr_default
            set_lr(self.optimizer, lr_default)
        batch = self.prepare(groups)
        res = StepResult(
            stepped=False,
            lr=self.lr,
            groups_local=batch.groups_local,
            groups_external=batch.groups_external,
            groups_zero_advantage=batch.groups_zero_advantage,
            groups_dropped_external=batch.groups_dropped_external,
        )
        if not batch.sequences:
            res.reason = "no usable group"
            res.seconds = time.perf_counter() - t0
            return res
        old_logp: list[Tensor] | None = None
        for k in range(cfg.steps_per_round):
            stats = self._accumulate_within_memory(batch, old_logp, res)
            if k == 0:
                fill_first_pass(res, batch, stats)
                if cfg.steps_per_round > 1:
                    # the first pass's log-probs are the proximal policy of the later, clipped passes;
                    # at r = 1 the plain and the clipped form have the same gradient, so pass 1 is unchanged
                    old_logp = stats.logp
            else:
                res.clipped_frac = token_mean(stats.clipped_frac, stats.n_tokens)
            if stats.n_kept == 0:
                res.reason = "all sequences filtered"
                break
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip))
            res.losses.append(stats.loss)
            res.grad_norms.append(norm)
            if not math.isfinite(norm):
                self.optimizer.zero_grad(set_to_none=True)
                if self.scaler is not None:  # fp16 overflow: a smaller loss scale next time
                    self.scaler.update(self.scaler.get_scale() / 2)
                res.reason = "non-finite gradient; step skipped"
                break
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            res.optimizer_steps += 1
            self.steps_done += 1
        res.stepped = res.optimizer_steps > 0
        res.micro_batch_tokens = self.token_budget
        if res.losses:
            res.loss, res.grad_norm = res.losses[0], res.grad_norms[0]
        res.seconds = time.perf_counter() - t0
        return res

    def _accumulate_within_memory(self, batch: PreparedBatch, old_logp: list[Tensor] | None,
                                  res: StepResult) -> PassStats:
        """`accumulate_gradients`; out of memory halves the token budget and runs the pass again (the budget
        stays halved: the card will not grow), until every micro-batch holds one sequence."""
        while True:
            try:
                return self.accumulate_gradients(batch, old_logp)
            except torch.OutOfMemoryError:
                self.optimizer.zero_grad(set_to_none=True)  # a part of the pass may have added to .grad
                release_cached_memory(self.device)
                n = len(batch.sequences)
                if len(self._micro_batches(n, batch.sequences)) >= n:
                    raise
                self.token_budget = max(1, self.token_budget // 2)
                res.oom_retries += 1
                log.warning("out of memory in a training step; retrying with micro-batches of %d tokens "
                            "(training.micro_batch_tokens)", self.token_budget)

    # ---- checkpointing -----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "steps_done": self.steps_done, "lr": self.lr}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_done = int(state.get("steps_done", 0))
        if self.cfg.lr is None and "lr" in state:
            self.lr = float(state["lr"])
        set_lr(self.optimizer, self.lr)
