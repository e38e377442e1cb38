"""Tasks: rewards, held-out eval sets, prompt ids from the network, and GSM8K data-file errors."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from swarm_node.config import TaskConfig
from swarm_node.errors import UserFacingError
from swarm_node.tasks import Prompt, Task, get_task
from swarm_node.tasks.arithmetic import ArithmeticTask
from swarm_node.tasks.gsm8k import GSM8KTask, answers_match, extract_answer, load_rows

DATA = Path(__file__).parent / "data" / "gsm8k_small.jsonl"


# --- arithmetic ---------------------------------------------------------------------------------
@pytest.fixture
def arith() -> ArithmeticTask:
    return ArithmeticTask(seed=0)


def test_arith_prompt_format(arith: ArithmeticTask) -> None:
    p = arith.prompt_from_id("arith:id:12+7") or arith.prompt_from_id("arith:id:12+8")
    assert p is not None and p.text.endswith("=") and len(p.text) <= 6
    for q in arith.train_prompts(200, np.random.default_rng(1)):
        a, rest = q.text[:-1].replace("-", "+", 1).split("+")
        assert 0 <= int(a) <= 99 and 0 <= int(rest) <= 99
        assert str(eval(q.text[:-1])) == q.answer  # noqa: S307 - digits and one operator only
        assert q.id == f"arith:id:{q.text[:-1]}"


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("19", 1.0),
        (" 19\n", 1.0),
        ("18", 0.0),
        ("", 0.0),
        ("19 ", 1.0),
        ("1 9", 0.0),
        ("019", 0.0),
        ("+19", 0.0),
    ],
)
def test_arith_reward(completion: str, expected: float) -> None:
    assert ArithmeticTask().reward(Prompt("arith:id:12+7", "12+7=", "19"), completion) == expected


def test_arith_negative_answer(arith: ArithmeticTask) -> None:
    p = next(q for q in arith.train_prompts(500, np.random.default_rng(2)) if q.answer.startswith("-"))
    a, b = p.text[:-1].split("-")
    assert int(p.answer) == int(a) - int(b) < 0
    assert arith.reward(p, p.answer) == 1.0
    assert arith.reward(p, p.answer.lstrip("-")) == 0.0


def test_arith_held_out_disjoint(arith: ArithmeticTask) -> None:
    eval_ids = {p.id for p in arith.eval_prompts("id", 10_000)}
    assert 1500 < len(eval_ids) < 2500  # ~10% of 20,000 problems
    train = arith.train_prompts(20_000, np.random.default_rng(3))
    assert not eval_ids & {p.id for p in train}
    assert not eval_ids & {
        f"arith:id:{t[:-1]}" for t, _ in arith.sft_examples(5000, np.random.default_rng(4))
    }
    ood3 = arith.eval_prompts("ood3", 300)
    assert len({p.id for p in ood3}) == 300
    assert all(int(x) >= 100 for p in ood3 for x in p.text[:-1].replace("-", "+").split("+"))
    train_texts = {p.text for p in train}
    for split in ("ood", "ood_formats"):
        ood = arith.eval_prompts(split, 300)
        assert len({p.text for p in ood}) == 300
        assert not train_texts & {p.text for p in ood}  # formats training never shows


def test_arith_ood_is_held_out_problems_with_a_sign(arith: ArithmeticTask) -> None:
    """ood: the i-th held-out id problem with a leading "+", a notation no training prompt has."""
    ood, held = arith.eval_prompts("ood", 2000), arith.eval_prompts("id", 2000)
    assert len(ood) == len(held) > 1500
    assert [p.text for p in ood] == ["+" + p.text for p in held] and [p.answer for p in ood] == [p.answer for p in held]
    for p in ood:
        assert str(eval(p.text[:-1])) == p.answer, p  # noqa: S307 (test-only, digits and +/- only)
        assert arith.prompt_from_id(p.id) is None and arith.is_held_out(p.id)
    # Never trained on: no training or warm-up prompt starts with a sign, and the underlying problems are the
    # held-out ones (a peer cannot smuggle them in under their id-split id either).
    rng = np.random.default_rng(11)
    train = [p.text for p in arith.train_prompts(20_000, rng)] + [t for t, _ in arith.sft_examples(5000, rng)]
    assert all(t[0].isdigit() for t in train)
    assert not {t[1:] for t in (p.text for p in ood)} & set(train)
    assert all(arith.prompt_from_id(f"arith:id:{p.text[1:-1]}") is None for p in ood[:200])
    # The order is part of the split's definition: published figures are on its first n problems.
    assert [p.text for p in ood[:4]] == ["+25-98=", "+11-22=", "+0+48=", "+14-25="]
    digest = hashlib.sha256("\n".join(p.text + p.answer for p in ood[:400]).encode()).hexdigest()
    assert digest[:16] == "9cd7aa921f47dd02"


def test_arith_ood_formats() -> None:
    """ood_formats (the earlier ood): spaced ("12 + 7 =") and chained ("3+8-5=") problems take turns."""
    ood = ArithmeticTask().eval_prompts("ood_formats", 200)
    spaced, chained = ood[0::2], ood[1::2]
    assert all(" " in p.text and p.text.endswith(" =") for p in spaced)
    assert all(" " not in p.text and len(p.text) == 6 for p in chained)
    for p in ood:
        expr = p.text.rstrip("=").replace(" ", "")
        assert str(eval(expr)) == p.answer, p  # noqa: S307 (test-only, digits and +/- only)
    t = ArithmeticTask()
    assert all(t.prompt_from_id(p.id) is None and t.is_held_out(p.id) for p in ood[:20])


def test_arith_eval_deterministic() -> None:
    a, b = ArithmeticTask(seed=0), ArithmeticTask(seed=123)
    for split in ("id", "ood", "ood_formats", "ood3"):
        assert a.eval_prompts(split, 50) == b.eval_prompts(split, 50)
        assert a.eval_prompts(split, 20) == a.eval_prompts(split, 50)[:20]  # fixed order: prefixes agree
    first = a.eval_prompts("id", 20)
    assert len({p.text[-3] for p in first}) > 1 and {"+", "-"} <= {c for p in first for c in p.text}
    with pytest.raises(ValueError):
        a.eval_prompts("nope", 3)


def test_arith_round_prompts_are_distinct(arith: ArithmeticTask) -> None:
    """A round's prompts are keyed by id on the wire, so one draw never repeats a problem (i.i.d. draws would:
    64 of 18,000 repeat with probability ~10%)."""
    for seed in range(200):
        ids = [p.id for p in arith.train_prompts(64, np.random.default_rng(seed))]
        assert len(set(ids)) == 64, seed
    assert len({p.id for p in arith.train_prompts(18_000, np.random.default_rng(0))}) == 18_000
    assert len(arith.train_prompts(18_010, np.random.default_rng(0))) == 18_010  # past the pool: repeats allowed


def test_arith_train_reproducible(arith: ArithmeticTask) -> None:
    assert arith.train_prompts(30, np.random.default_rng(7)) == arith.train_prompts(
        30, np.random.default_rng(7)
    )
    assert arith.sft_examples(5) == arith.sft_examples(5)


def test_arith_prompt_from_id(arith: ArithmeticTask) -> None:
    for p in arith.train_prompts(100, np.random.default_rng(5)):
        assert arith.prompt_from_id(p.id) == p
    for p in arith.eval_prompts("id", 50) + arith.eval_prompts("ood", 10) + arith.eval_prompts("ood_formats", 10):
        assert arith.prompt_from_id(p.id) is None  # eval problems never enter training via a peer
        assert arith.is_held_out(p.id)
    junk = [
        "",
        "arith:id:",
        "arith:id:12*7",
        "arith:id:100+1",
        "arith:id:07+1",
        "arith:id:-3+1",
        "arith:12+7",
        "arith:id:12+7\n",
        " arith:id:12+7",
        "gsm8k:abcd:1",
        "arith:id:12+7" + "0" * 100,
        "arith:xx:1+1",
        "arith:ood:12+7",
        "arith:id:١٢+7",
        None,
        12,
    ]
    for j in junk:
        assert arith.prompt_from_id(j) is None  # type: ignore[arg-type]


# --- GSM8K answer checking ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pred", "gold", "ok"),
    [
        ("1234", "1234", True),
        ("1,234", "1234", True),
        ("$1,234", "1234", True),
        ("\\$1,234", "1234", True),
        ("1,234,567", "1234567", True),
        ("18.0", "18", True),
        ("18.", "18", True),
        ("18.5", "18", False),
        ("-5", "-5", True),
        ("5", "-5", False),
        ("-5", "5", False),
        ("\\frac{36}{2}", "18", True),
        ("36/2", "18", True),
        ("0.5", "1/2", True),
        ("abc", "18", False),
        ("", "18", False),
        ("1" * 200, "18", False),
    ],
)
def test_answers_match(pred: str, gold: str, ok: bool) -> None:
    assert answers_match(pred, gold) is ok


@pytest.mark.parametrize(
    ("completion", "content"),
    [
        ("<answer>18</answer>", "18"),
        ("Reasoning... so <answer> 18 </answer> done", "18"),
        ("18", None),
        ("<answer>18", None),
        ("18</answer>", None),
        ("</answer>18<answer>", None),
        ("<answer>1</answer><answer>18</answer>", None),
        ("<answer><answer>18</answer>", None),
        ("<answer></answer>", None),
        ("<answer>   </answer>", None),
        ("<answer>" + "9" * 65 + "</answer>", None),
        ("", None),
    ],
)
def test_extract_answer(completion: str, content: str | None) -> None:
    assert extract_answer(completion) == content


@pytest.fixture
def gsm() -> GSM8KTask:
    return GSM8KTask(DATA)


def test_gsm8k_rewards(gsm: GSM8KTask) -> None:
    p = Prompt("x", "q", "1234")
    assert gsm.reward(p, "So the total is <answer>$1,234</answer>") == 1.0
    assert gsm.reward(p, "<answer>1234.0</answer>") == 1.0
    assert gsm.reward(p, "<answer>1235</answer>") == pytest.approx(0.1)
    assert gsm.reward(p, "1234") == 0.0
    assert gsm.reward(p, "<answer>1234</answer> <answer>1234</answer>") == 0.0
    assert gsm.reward(p, "<answer>1234") == 0.0
    assert gsm.reward(p, "") == 0.0
    assert gsm.reward(Prompt("x", "q", "-5"), "<answer>-5</answer>") == 1.0
    assert gsm.is_correct(p, "<answer>1,234</answer>") and not gsm.is_correct(p, "<answer>1</answer>")


def test_gsm8k_reward_off_main_thread(gsm: GSM8KTask) -> None:
    """math-verify's signal-based timeout cannot run off the main thread; the reward must still work."""
    out: list[float] = []
    p = Prompt("x", "q", "18")
    t = threading.Thread(target=lambda: out.extend([gsm.reward(p, "<answer>\\frac{36}{2}</answer>")]))
    t.start()
    t.join(30)
    assert out == [1.0]


def test_gsm8k_file_gold_answers() -> None:
    rows = load_rows(DATA)
    assert len(rows) == 20
    golds = [r.gold for r in rows]
    assert "1234" in golds and "-5" in golds and "2050" in golds


def test_gsm8k_prompts_and_ids(gsm: GSM8KTask) -> None:
    assert gsm.task_id.startswith("gsm8k-") and len(gsm.task_id) == len("gsm8k-") + 8
    evals = gsm.eval_prompts("id", 100)
    assert len(evals) == 2 and evals == gsm.eval_prompts("id", 100)
    assert "<answer></answer>" in evals[0].text
    train = gsm.train_prompts(18, np.random.default_rng(0))
    assert len({p.id for p in train}) == 18  # without replacement when the file is big enough
    assert not {p.id for p in evals} & {p.id for p in gsm.train_prompts(500, np.random.default_rng(1))}
    for p in train:
        assert p.id.startswith(f"gsm8k:{gsm.fp}:") and gsm.prompt_from_id(p.id) == p
    for p in evals:
        assert gsm.prompt_from_id(p.id) is None
    for j in [
        "",
        "gsm8k",
        f"gsm8k:{gsm.fp}:",
        f"gsm8k:{gsm.fp}:-1",
        f"gsm8k:{gsm.fp}:01",
        f"gsm8k:{gsm.fp}:999",
        "gsm8k:deadbeef:1",
        f"gsm8k:{gsm.fp}:1:2",
        f"gsm8k:{gsm.fp}:" + "1" * 100,
        "arith:id:1+1",
        f"gsm8k:{gsm.fp}:١",
    ]:
        assert gsm.prompt_from_id(j) is None


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_eval_file_and_fingerprint(tmp_path: Path) -> None:
    train = _write_jsonl(
        tmp_path / "train.jsonl", [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(5)]
    )
    ev = _write_jsonl(tmp_path / "eval.jsonl", [{"question": "e", "answer": "#### 7"}])
    t = GSM8KTask(train, eval_data_path=ev)
    assert len(t.train_prompts(5, np.random.default_rng(0))) == 5 and t.prompt_from_id(f"gsm8k:{t.fp}:4")
    assert [p.answer for p in t.eval_prompts("id", 10)] == ["7"]
    other = _write_jsonl(
        tmp_path / "other.jsonl", [{"question": f"q{i}", "answer": f"#### {i + 1}"} for i in range(5)]
    )
    assert GSM8KTask(other, eval_data_path=ev).task_id != t.task_id
    with pytest.raises(UserFacingError, match="same contents"):
        GSM8KTask(train, eval_data_path=train)


def test_gsm8k_parquet(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    pq.write_table(
        pa.table({"question": [r["question"] for r in rows], "answer": [r["answer"] for r in rows]}), path
    )
    t = GSM8KTask(path)
    assert [p.answer for p in t.eval_prompts("id", 5)] == ["15", "18"]
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"question": ["a", "b"], "answer": ["#### 1", "no marker"]}), bad)
    with pytest.raises(UserFacingError, match=r"bad\.parquet: row 2: .*####"):
        load_rows(bad)
    nocol = tmp_path / "nocol.parquet"
    pq.write_table(pa.table({"question": ["a"]}), nocol)
    with pytest.raises(UserFacingError, match=r"nocol\.parquet: .*missing field 'answer'"):
        load_rows(nocol)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    with pytest.raises(UserFacingError, match=r"junk\.parquet"):
        load_rows(junk)


GOOD = '{"question": "q", "answer": "#### 1"}\n'


@pytest.mark.parametrize(
    ("name", "content", "pattern"),
    [
        ("bad.jsonl", GOOD + "{not json\n", r"bad\.jsonl: line 2: invalid JSON"),
        ("bad.jsonl", GOOD + GOOD + '{"question": "q"}\n', r"bad\.jsonl: line 3: missing field 'answer'"),
        ("bad.jsonl", '{"answer": "#### 1"}\n', r"bad\.jsonl: line 1: missing field 'question'"),
        ("bad.jsonl", GOOD + "\n" + '{"question": "q", "answer": "42"}\n', r"bad\.jsonl: line 3: .*'####'"),
        ("bad.jsonl", '{"question": "q", "answer": "#### "}\n', r"bad\.jsonl: line 1: .*'####'"),
        ("bad.jsonl", '["q", "a"]\n', r"bad\.jsonl: line 1: expected an object"),
        (
            "bad.jsonl",
            '{"question": 3, "answer": "#### 1"}\n',
            r"bad\.jsonl: line 1: field 'question' must be a string",
        ),
        ("bad.jsonl", "", r"bad\.jsonl: empty file"),
        ("bad.jsonl", "\n  \n", r"bad\.jsonl: empty file"),
        ("bad.csv", "question,answer\n", r"bad\.csv: unsupported extension"),
    ],
)
def test_gsm8k_malformed_files(tmp_path: Path, name: str, content: str, pattern: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(UserFacingError, match=pattern):
        GSM8KTask(path)


def test_gsm8k_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(UserFacingError, match="not found"):
        GSM8KTask(tmp_path / "nope.jsonl")
    path = tmp_path / "bin.jsonl"
    path.write_bytes(GOOD.encode() + b"\xff\xfe\n")
    with pytest.raises(UserFacingError, match=r"bin\.jsonl: line 2: not valid UTF-8"):
        load_rows(path)
    one = _write_jsonl(tmp_path / "one.jsonl", [{"question": "q", "answer": "#### 1"}])
    with pytest.raises(UserFacingError, match="eval_data_path"):
        GSM8KTask(one)


# --- registry -----------------------------------------------------------------------------------
def test_get_task() -> None:
    t = get_task(TaskConfig())
    assert isinstance(t, Task) and t.task_id == "arithmetic-v2"
    g = get_task(TaskConfig(name="gsm8k", data_path=str(DATA)))
    assert isinstance(g, GSM8KTask) and g.task_id.startswith("gsm8k-")
    with pytest.raises(UserFacingError, match="data_path"):
        get_task(TaskConfig(name="gsm8k"))
    with pytest.raises(UserFacingError, match="eval_split"):
        get_task(TaskConfig(name="gsm8k", data_path=str(DATA), eval_split="ood"))
