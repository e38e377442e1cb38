"""How a task's problem is put to a model (`task.prompt_form`), and how the answer is read back.

  * "bare"    - the problem alone ("12+7="), the completion compared whole: the tiny character-level
                presets, which were warmed up on exactly this.
  * "fewshot" - a plain-text prefix of solved problems, then the problem: for base (non-chat) models. Use it
                with `generation.chat_template: off` (the config refuses `on`).
  * "chat"    - a short instruction, for instruct models; the node wraps it in the tokenizer's chat
                template (`generation.chat_template: auto`).

"fewshot" and "chat" read the answer with `tasks/answers.py` (the answer line's final integer, or its
text for reasoning-gym), so restated problems and made-up next examples do not cost the reward. The
form is part of the task id on the wire: peers that pose problems differently never share groups.
"""

from __future__ import annotations

from typing import Literal

PromptForm = Literal["bare", "fewshot", "chat"]
PROMPT_FORMS: tuple[str, ...] = ("bare", "fewshot", "chat")

# Solved examples of the few-shot prefix: training problems only (a test checks none is held out), one
# with a negative answer so the format of those is shown too.
ARITHMETIC_SHOTS: tuple[tuple[str, str], ...] = (("23+14", "37"), ("45-23", "22"), ("7+5", "12"), ("15-38", "-23"))
ARITHMETIC_INSTRUCTION = "Compute {problem}. Reply with the number only."


def check_form(form: str) -> str:
    if form not in PROMPT_FORMS:
        raise ValueError(f"unknown prompt form {form!r}; expected one of {PROMPT_FORMS}")
    return form


def arithmetic_text(form: str, problem: str) -> str:
    """The prompt text of an arithmetic problem such as "12+7" in a prompt form."""
    if form == "bare":
        return f"{problem}="
    if form == "fewshot":
        return "".join(f"{q}={a}\n" for q, a in ARITHMETIC_SHOTS) + f"{problem}="
    if form == "chat":
        return ARITHMETIC_INSTRUCTION.format(problem=problem)
    raise ValueError(f"unknown prompt form {form!r}; expected one of {PROMPT_FORMS}")


def question_text(form: str, question: str, shots: list[tuple[str, str]] = ()) -> str:
    """A free-text question (reasoning-gym) in a prompt form; `shots` are solved (question, answer) examples."""
    if form == "bare":
        return question
    if form == "fewshot":
        prefix = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in shots)
        return f"{prefix}Question: {question}\nAnswer:"
    if form == "chat":
        return f"{question}\nReply with the final answer only, on one line."
    raise ValueError(f"unknown prompt form {form!r}; expected one of {PROMPT_FORMS}")


def task_id_for(base: str, form: str) -> str:
    """The wire task id: the base id for "bare" (so the tiny presets' swarms are unchanged), else base/form."""
    return base if check_form(form) == "bare" else f"{base}.{form}"
