"""Measured peaks, to check the plan against: torch's allocator on CUDA, the process's high-water mark on CPU.

On CPU the peak is the resident set's high-water mark (Linux `VmHWM`, reset by writing 5 to
/proc/self/clear_refs), less the resident set before the model was built: what the model, the optimizer and
the step added. glibc's malloc returns large blocks to the system when they are freed only below its mmap
threshold; `MALLOC_MMAP_THRESHOLD_=65536` in the environment (set by the tests and the benchmark for their
measuring processes) keeps that threshold fixed, so freed tensors leave the resident set.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

_STATUS = Path("/proc/self/status")


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.M)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return int(match.group(1)) * 1024


class PeakMeter:
    """The peak bytes of a block of work on `device`, over a baseline taken at construction."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.baseline = self.current()

    def current(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        return _status_kib("VmRSS")

    def reset(self) -> None:
        """Start a new peak from now."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            Path("/proc/self/clear_refs").write_text("5")

    def peak(self) -> int:
        """The peak since the last reset, less the baseline."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device)) - self.baseline
        return _status_kib("VmHWM") - self.baseline


def synthetic_groups(prompts: int, generations: int, prompt_tokens: int, completion_tokens: int, vocab: int,
                     seed: int = 0) -> list[Any]:
    """One round of full-length groups with random tokens and mixed rewards (every sequence is trained on)."""
    from swarm_node.training.groups import TrainGroup

    rng = np.random.default_rng(seed)
    hi = max(2, min(vocab, 30_000))
    return [TrainGroup(prompt_ids=rng.integers(1, hi, prompt_tokens).tolist(),
                       completions=[rng.integers(1, hi, completion_tokens) for _ in range(generations)],
                       behaviour_logprobs=[np.full(completion_tokens, -3.0, np.float32) for _ in range(generations)],
                       rewards=np.tile(np.array([1.0, 0.0], np.float32), generations // 2 + 1)[:generations])
            for _ in range(prompts)]


def measure_training_step(trainer: Any, groups: list[Any], meter: PeakMeter) -> dict:
    """One warm-up step (it creates the optimizer state), then the measured step: its peak and seconds."""
    trainer.step(groups)
    meter.reset()
    t0 = time.perf_counter()
    res = trainer.step(groups)
    seconds = time.perf_counter() - t0
    return {"peak_bytes": meter.peak(), "seconds": round(seconds, 3), "stepped": res.stepped,
            "micro_batch_tokens": res.micro_batch_tokens}
