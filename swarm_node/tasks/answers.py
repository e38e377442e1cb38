"""Answer extraction for free-text completions of real language models, and the exact-answer rewards on it.

A tiny character-level preset emits just "19" and EOS, so its reward compares the whole completion. A
real instruct model answers "19", "12 + 7 = 19", "The answer is 19." or restates the problem first;
a base model under a few-shot prefix writes "19" and then makes up the next example. The rule here
survives all of these: the first non-empty line is the answer line, and its answer is the integer after
the last "=" when there is one, else the last integer of the line. Operands of a restated problem come
before the "=" (or before the answer), so they are never taken for it.

The reward stays exact: 1 when the extracted integer equals the reference, else 0 (no credit for "close").
"""

from __future__ import annotations

import re

MAX_SCAN_CHARS = 512  # completions come from models and peers: only the head is looked at
_INT = re.compile(r"(?<![\d.])-?\d+(?:,\d{3})*(?!\d|\.\d)")  # "2.5" has no integer; "15-3" is 15 and 3


def answer_line(completion: str) -> str:
    """The first non-empty line of a completion, stripped (the empty string when there is none)."""
    for line in completion[:MAX_SCAN_CHARS].splitlines():
        if line.strip():
            return line.strip()
    return ""


def final_integer(completion: str) -> int | None:
    """The answer of a completion's answer line: the integer after its last "=", else its last integer.

    "19" -> 19; "12 + 7 = 19." -> 19; "3 - 15 = -12" -> -12; "The answer is 1,024" -> 1024;
    "12 + 7" -> 7 (a restatement without an answer gives a wrong number, never a right one by luck of
    position); no digits -> None.
    """
    line = answer_line(completion)
    tail = line.rsplit("=", 1)[1] if "=" in line else line
    found = _INT.findall(tail)
    if not found:
        return None
    return int(found[-1 if "=" not in line else 0].replace(",", ""))


def integer_reward(completion: str, answer: str) -> float:
    """1.0 when the completion's extracted integer equals the reference answer exactly, else 0.0."""
    got = final_integer(completion)
    try:
        return 1.0 if got is not None and got == int(answer) else 0.0
    except ValueError:  # a non-integer reference cannot be matched by an integer
        return 0.0


def first_line_answer(completion: str) -> str:
    """Free-text answers (reasoning-gym): the answer line without an "Answer:" label or a final period."""
    line = answer_line(completion)
    line = re.sub(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is)?\s*[:=]?\s*", "", line, flags=re.IGNORECASE)
    return line[:-1].rstrip() if line.endswith(".") else line
