"""The benchmarks' shared pieces: one node config, one held-out scorer that is the node's own evaluation,
the shared seed/size/JSON arguments (tooling/benchmark_nodes.py, benchmark_args.py), one way to run
(`python -m benchmarks.NAME`) and the index. Tests import no benchmark: a benchmark is read as source or
run as a process, the way the docs run it."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tooling import benchmark_args as bench_args
from tooling import benchmark_nodes as nodes

ROOT = Path(__file__).resolve().parents[1]
HELPERS = {"__init__", "frozen_source"}  # modules that are not benchmarks themselves
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem not in HELPERS)
TEMPLATE = "{% for m in messages %}Q: {{ m['content'] }}\nA:{% endfor %}"


def test_the_index_lists_every_benchmark_with_its_command_and_sizes():
    index = (ROOT / "benchmarks" / "README.md").read_text()
    listed = re.findall(r"^\| `([a-z_]+)` \|", index, flags=re.M)
    assert sorted(listed) == BENCHMARKS  # no benchmark missing from the index, none listed that is gone
    for row in re.findall(r"^\| `[a-z_]+` \|.*$", index, flags=re.M):
        where = row.split("|")[-2]
        doc = re.match(r" *(docs/[a-z_/-]+\.md) ", where)
        assert doc, row
        text = (ROOT / doc.group(1)).read_text()
        sections = re.findall(r'"([^"]+)"', where)
        assert sections, row
        for title in sections:  # every section the index names exists (a heading that starts with it)
            assert re.search(rf"^#+ {re.escape(title)}", text, flags=re.M), (row, title)


def test_docs_run_benchmarks_one_way():
    """Every command line in the docs starts a benchmark as a module, never as a script path."""
    docs = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    docs += sorted((ROOT / "benchmarks").glob("*.py"))
    for path in docs:
        text = path.read_text()
        assert not re.search(r"python3? benchmarks/", text), path
        assert "PYTHONPATH=$PWD python" not in text, path
        assert "sys.path.insert" not in text or path.name == "test_benchmark_harness.py", path


def shared_arguments_missing(source: str) -> list[str]:
    """What a benchmark's source lacks of the one way to run: a main() that adds the shared arguments
    (tooling.benchmark_args.add_run_args) and a __main__ guard that calls it."""
    tree = ast.parse(source)
    mains = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main"]
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    shared = any(isinstance(n, ast.ImportFrom) and n.module == "tooling.benchmark_args"
                 and "add_run_args" in {a.name for a in n.names} for n in ast.walk(tree))
    guard = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) and "main()" in ast.unparse(n)
                for n in tree.body)
    return [what for what, ok in (("main()", bool(mains)), ("add_run_args(...)", "add_run_args" in calls),
                                  ("from tooling.benchmark_args import add_run_args", shared),
                                  ("if __name__ == '__main__': main()", guard)) if not ok]


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_takes_the_shared_arguments(name):
    assert shared_arguments_missing((ROOT / "benchmarks" / f"{name}.py").read_text()) == []


def test_the_source_check_finds_a_benchmark_without_the_shared_arguments():
    """The check above can fail: a benchmark that parses its own arguments is reported."""
    source = "import argparse\n\ndef main():\n    argparse.ArgumentParser().parse_args()\n"
    assert shared_arguments_missing(source) == ["add_run_args(...)", "from tooling.benchmark_args import add_run_args",
                                                "if __name__ == '__main__': main()"]


def _help(name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow
def test_every_benchmark_starts_as_a_module_and_shows_the_shared_arguments():
    """`python -m benchmarks.NAME --help` for every benchmark, as the docs run them: its imports resolve
    (a moved or renamed module fails here) and its help lists the shared arguments."""
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        runs = dict(zip(BENCHMARKS, pool.map(_help, BENCHMARKS), strict=True))
    for name, run in runs.items():
        assert run.returncode == 0, (name, run.stderr[-2000:])
        for flag in ("--quick", "--seeds", "--seed", "--json"):
            assert flag in run.stdout, (name, flag)


def parse(argv: list[str], **defaults) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    bench_args.add_run_args(ap, **{"seeds": 3, "quick": "small", **defaults})
    return ap.parse_args(argv)


def test_seeds_default_quick_default_and_explicit_value():
    assert bench_args.resolve_seeds(parse([])) == [0, 1, 2]
    assert bench_args.resolve_seeds(parse(["--quick"], quick_seeds=1)) == [0]
    assert bench_args.resolve_seeds(parse(["--quick", "--seeds", "2"], quick_seeds=1)) == [0, 1]  # explicit wins
    assert bench_args.resolve_seeds(parse(["--seed", "5", "--seeds", "2"], first_seed=1)) == [5, 6]
    assert bench_args.resolve_seeds(parse([], first_seed=1)) == [1, 2, 3]
    with pytest.raises(SystemExit):
        bench_args.resolve_seeds(parse(["--seeds", "0"]))


def test_json_output_records_how_it_was_made(tmp_path, monkeypatch):
    a = parse(["--seed", "4", "--seeds", "2", "--json", str(tmp_path / "deep" / "out.json")])
    bench_args.resolve_seeds(a)
    monkeypatch.setattr(sys, "argv", ["x", "--seed", "4"])
    bench_args.write_json(a.json, {"table": [1, 2]}, a)
    doc = json.loads(a.json.read_text())
    assert doc["table"] == [1, 2] and doc["run"]["seeds"] == [4, 5]
    assert doc["run"]["command"].startswith("python -m ") and doc["run"]["command"].endswith("--seed 4")
    assert {"date", "machine", "cpus"} <= set(doc["run"])
    bench_args.write_json(tmp_path / "rows.json", [{"a": 1}], a)  # a list is kept whole under "results"
    assert json.loads((tmp_path / "rows.json").read_text())["results"] == [{"a": 1}]
    assert bench_args.public_args(a)["json"] == str(a.json) and "_default_seeds" not in bench_args.public_args(a)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """A tiny random model whose tokenizer has a chat template, saved as a checkpoint."""
    from swarm_node.models.factory import PRESETS, build_model, build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    model = build_model(PRESETS["tiny-s"], len(tok), tok.pad_token_id, tok.eos_token_id, seed=1)
    path = tmp_path_factory.mktemp("bench") / "chat-model"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_node_config_defaults_and_overrides(chat_model):
    cfg = nodes.node_config(str(chat_model), 3, training={"variant": "on_policy"})
    assert (cfg.seed, cfg.task.name, cfg.task.prompts_per_round, cfg.task.eval_n) == (3, "arithmetic", 16, 400)
    assert (cfg.generation.num_generations, cfg.generation.max_new_tokens) == (8, 6)
    assert cfg.training.variant == "on_policy" and cfg.metrics.eval_every == nodes.NEVER
    cfg = nodes.node_config({"path": str(chat_model), "name": "x"}, 0, eval_n=7, max_new_tokens=8, rounds=5,
                            task={"eval_split": "ood"}, generation={"chat_template": "off"}, pipeline=True)
    assert (cfg.model.name, cfg.task.eval_n, cfg.task.eval_split, cfg.generation.max_new_tokens) == ("x", 7, "ood", 8)
    assert cfg.task.name == "arithmetic" and cfg.rounds == 5 and cfg.pipeline and cfg.generation.chat_template == "off"


def test_heldout_score_is_the_nodes_own_evaluation(chat_model, tmp_path, monkeypatch):
    """The benchmarks' scorer and GRPONode.evaluate hand score_prompts the same prompts, token budget, batch
    size and prompt encoder (the node's, so a chat template applies), so their numbers cannot drift apart."""
    import swarm_node.evaluation as evaluation

    cfg = nodes.node_config({"path": str(chat_model), "device": "cpu", "dtype": "float32"}, 0, prompts=2, eval_n=6,
                            generations=2, max_new_tokens=3, generation={"batch_size": 96})
    node = nodes.grpo_node(cfg, tmp_path / "state")
    assert node.prompts.template is not None
    calls = []
    real = evaluation.score_prompts

    def spy(model, tok, task, prompts, max_new_tokens, batch_size=256, encode=None, generator=None):
        assert generator is None  # a transformers node evaluates with transformers, as the benchmarks do
        calls.append(([p.id for p in prompts], max_new_tokens, batch_size, [encode(p.text) for p in prompts]))
        return real(model, tok, task, prompts, max_new_tokens, batch_size, encode)

    monkeypatch.setattr(evaluation, "score_prompts", spy)
    monkeypatch.setattr(nodes, "score_prompts", spy)
    accuracy = node.evaluate()["accuracy"]
    score = nodes.heldout_score(node)
    assert calls[0] == calls[1] and score.accuracy == accuracy and len(score.hits) == 6
    ids, max_new, batch, encoded = calls[1]
    assert max_new == 3 and batch == 96
    texts = node.task.eval_prompts("id", 6)
    assert encoded == [node.tok(f"Q: {p.text}\nA:", add_special_tokens=False)["input_ids"] for p in texts]
    nodes.heldout_score(node, "ood", 4, max_new_tokens=8, batch_size=5)  # a committed table's own setting
    assert calls[2][:3] == ([p.id for p in node.task.eval_prompts("ood", 4)], 8, 5)


REAL_LEARNING_PEERS = ("smollm2-135m", "smollm2-135m-lora")  # benchmarks/real_learning.py's PEERS


def _real_learning_results(arm: str, seeds: list[int], rounds: int = 24) -> list[dict]:
    """Made-up runs of benchmarks.real_learning: per seed and peer, 10 problems, hits chosen per arm."""
    results = []
    for seed in seeds:
        for model in REAL_LEARNING_PEERS:
            start = [i < 3 for i in range(10)]
            end = [i < (6 if arm == "ftis" else 5) + seed % 2 for i in range(10)]
            results.append({"arm": arm, "seed": seed, "model": model, "start": 0.3, "start_hits": start,
                            "end": sum(end) / 10, "hits": end, "curve": [(0, 0.3), (rounds, sum(end) / 10)],
                            "sample_s_per_round": 1.0, "train_s_per_round": 2.0, "external_groups_trained": 0,
                            "reward_first": 0.1, "reward_last": 0.2})
    return results


def _real_learning_part(path: Path, results: list[dict], rounds: int = 24, seconds: float = 100.0) -> Path:
    """The runs as a --json file of benchmarks.real_learning."""
    args = {"rounds": rounds, "eval_n": 200, "prompts": None, "lr_full": None, "lr_lora": None}
    path.write_text(json.dumps({"args": args, "seconds": seconds, "results": results, "table": []}))
    return path


@pytest.mark.slow
def test_real_learning_combines_runs_of_other_arms_into_the_table_of_one_run(tmp_path):
    """Arms run as two processes (one per core) give the table that one process running both would give:
    `--combine` of the two files against `--combine` of one file holding every run, as real processes."""
    alone, ftis = _real_learning_results("alone", [0, 1, 2]), _real_learning_results("ftis", [0, 1, 2])
    a = _real_learning_part(tmp_path / "a.json", alone)
    f = _real_learning_part(tmp_path / "f.json", ftis)
    one = _real_learning_part(tmp_path / "one.json", alone + ftis, seconds=200.0)
    other = _real_learning_part(tmp_path / "o.json", _real_learning_results("naive", [0], 12), rounds=12)

    def combine(*argv: str | Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "benchmarks.real_learning", "--combine", *map(str, argv)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})

    calls = [(a, f, "--json", tmp_path / "c.json"), (one, "--json", tmp_path / "c1.json"),
             (a, other), (a, a)]  # another size, and the same runs twice: refused
    with ThreadPoolExecutor(max_workers=2) as pool:
        two, single, other_size, twice = pool.map(lambda argv: combine(*argv), calls)
    assert two.returncode == 0 and single.returncode == 0, (two.stderr[-2000:], single.stderr[-2000:])
    both, reference = json.loads((tmp_path / "c.json").read_text()), json.loads((tmp_path / "c1.json").read_text())
    assert both["table"] == reference["table"] and len(both["table"]) == 4
    assert both["seconds"] == 200.0 and both["args"]["rounds"] == 24
    ftis_rows = [e for e in both["table"] if e["arm"] == "ftis"]
    assert len(ftis_rows) == 2 and all("vs_alone" in e and e["vs_alone"][0] > 0 for e in ftis_rows)  # paired across files
    assert "combined 12 runs from 2 files" in two.stdout
    assert other_size.returncode != 0 and "cannot combine" in other_size.stderr
    assert twice.returncode != 0 and "also in an earlier file" in twice.stderr
