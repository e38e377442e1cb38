"""Prompt text -> token ids, the one way a node encodes prompts: for sampling, eval and peers' groups.

A peer's group is admitted only if its prompt ids equal what this encoder makes of the prompt rebuilt from
its id, so every node of a swarm must encode alike (same tokenizer, chat_template and max_prompt_tokens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarm_node.errors import UserFacingError


def chat_template_setting(chat_template: str, prompt_form: str = "bare") -> str:
    """The template setting a node encodes with: a few-shot prompt is plain text, so "auto" means "off" for it
    (the config refuses "on" with it). Recorded in checkpoints, so `swarm-node eval` encodes alike."""
    return "off" if prompt_form == "fewshot" and chat_template == "auto" else chat_template


class PromptEncoder:
    """`chat_template`: "auto" (the tokenizer's template if it has one), "on" (it must), "off", or a file."""

    def __init__(self, tokenizer: Any, chat_template: str = "auto", max_prompt_tokens: int = 1024) -> None:
        self.tokenizer = tokenizer
        self.max_prompt_tokens = int(max_prompt_tokens)
        if self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
        own = getattr(tokenizer, "chat_template", None) or None
        if chat_template == "off":
            self.template: str | None = None
        elif chat_template == "auto":
            self.template = own
        elif chat_template == "on":
            if own is None:
                raise UserFacingError("generation.chat_template is 'on' but the tokenizer has no chat template; "
                                      "use 'auto', 'off' or the path of a Jinja template file")
            self.template = own
        else:
            path = Path(chat_template).expanduser()
            if not path.is_file():
                raise UserFacingError(f"generation.chat_template {chat_template!r} is not auto/on/off nor a "
                                      "readable template file")
            self.template = path.read_text()

    def text(self, prompt: str) -> str:
        """The prompt as the model sees it: one user turn plus the assistant header, or the plain text."""
        if self.template is None:
            return prompt
        return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], chat_template=self.template,
                                                  tokenize=False, add_generation_prompt=True)

    def encode(self, prompt: str) -> list[int]:
        """Token ids, no special tokens added beyond what the template writes; the last max_prompt_tokens kept."""
        ids = self.tokenizer(self.text(prompt), add_special_tokens=False)["input_ids"]
        return list(ids[-self.max_prompt_tokens:])
