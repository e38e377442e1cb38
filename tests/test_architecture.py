"""The package's shape is checked, not just described: import layers (import-linter) and no import cycles.

The contracts live in pyproject.toml ([tool.importlinter]); docs/architecture.md explains them. The cycle
check counts function-local imports too, since a lazy import that closes a cycle still ties two modules
together.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    adj = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(adj):
        if root in index:
            continue
        work = [(root, iter(adj[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(adj[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles_counting_function_local_imports() -> None:
    assert _cycles(grimp.build_graph("swarm_node")) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a graph with a lazy a -> b -> a import is reported."""
    g = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        g.add_module(m)
    g.add_import(importer="p.a", imported="p.b")
    g.add_import(importer="p.b", imported="p.a")
    g.add_import(importer="p.c", imported="p.a")
    assert _cycles(g) == [["p.a", "p.b"]]


def test_import_contracts_are_kept(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(ROOT)
    # lint_imports configures logging with dictConfig, which disables every logger that already exists
    # (disable_existing_loggers): later tests in this process would then capture no log records
    import importlinter.cli

    monkeypatch.setattr(importlinter.cli, "_configure_logging", lambda verbose: None)
    code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert code == 0, out


def _contract(name_start: str) -> Any:
    """One contract of pyproject.toml, built as lint-imports builds it."""
    from importlinter.application.use_cases import _normalize_user_options, read_user_options
    from importlinter.contracts.forbidden import ForbiddenContract
    from importlinter.contracts.layers import LayersContract

    options = _normalize_user_options(read_user_options(str(ROOT / "pyproject.toml")))
    [found] = [c for c in options.contracts_options if c["name"].startswith(name_start)]
    kind = {"forbidden": ForbiddenContract, "layers": LayersContract}[found["type"]]
    return kind(found["name"], options.session_options, found)


def test_the_network_room_contract_fails_when_another_package_imports_hivemind() -> None:
    """Only swarm_node.swarm imports hivemind: the contract holds on the package as it is, and one
    `import hivemind` anywhere else (a lazy one in the DPO round, as the old all-reduce had) breaks it."""
    graph = grimp.build_graph("swarm_node", include_external_packages=True, cache_dir=None)
    contract = _contract("one network room")
    assert contract.check(copy.deepcopy(graph), verbose=False).kept
    for importer in ("swarm_node.dpo.round", "swarm_node.node.loop", "swarm_node.training.ftis"):
        broken = copy.deepcopy(graph)
        broken.add_import(importer=importer, imported="hivemind", line_number=1, line_contents="import hivemind")
        check = contract.check(broken, verbose=False)
        assert not check.kept, importer
    # ... and so does a torch import in the swarm layer outside its DPO parameter averaging
    contract = _contract("the network layer moves opaque bytes")
    assert contract.check(copy.deepcopy(graph), verbose=False).kept
    graph.add_import(importer="swarm_node.swarm.receiver", imported="torch", line_number=1, line_contents="import torch")
    assert not contract.check(graph, verbose=False).kept
# Who may import whom outside the package: tests and benchmarks share tooling/ and never import each other,
# tooling/ imports neither, and the installed package imports none of the three (none of them is in the wheel).
FORBIDDEN = {"tests": {"benchmarks"}, "benchmarks": {"tests"}, "tooling": {"tests", "benchmarks"},
             "swarm_node": {"tests", "benchmarks", "tooling"}}


def _imported_roots(tree: ast.AST) -> set[str]:
    """Top-level names a module imports: function-local imports and importlib.import_module("x.y") (an
    f-string's leading text too) included; relative imports stay inside their own folder."""
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) and node.args \
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module":
            arg = node.args[0]
            text = arg.values[0] if isinstance(arg, ast.JoinedStr) and arg.values else arg
            if isinstance(text, ast.Constant) and isinstance(text.value, str):
                roots.add(text.value.split(".")[0])
    return roots


def forbidden_imports(root: Path) -> list[str]:
    found = []
    for folder, banned in FORBIDDEN.items():
        for path in sorted((root / folder).rglob("*.py")):
            bad = _imported_roots(ast.parse(path.read_text(), str(path))) & banned
            found += [f"{path.relative_to(root)} imports {name}" for name in sorted(bad)]
    return found


def test_tests_and_benchmarks_share_tooling_and_never_import_each_other() -> None:
    assert forbidden_imports(ROOT) == []


def test_the_import_check_finds_tests_and_benchmarks_that_import_each_other(tmp_path: Path) -> None:
    """The check above can fail: each kind of forbidden import in a made-up checkout is reported."""
    files = {"tests/test_a.py": "def f():\n    import os, benchmarks.wire\n",
             "tests/test_b.py": "import importlib\nimportlib.import_module(f'benchmarks.{1}')\n",
             "benchmarks/x.py": "import tests.adversary\nfrom tooling import batches\n",
             "tooling/y.py": "from tests.conftest import ROOT\n",
             "swarm_node/z.py": "from tooling.fuzzing import pick\nfrom . import tests\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert forbidden_imports(tmp_path) == ["tests/test_a.py imports benchmarks", "tests/test_b.py imports benchmarks",
                                           "benchmarks/x.py imports tests", "tooling/y.py imports tests",
                                           "swarm_node/z.py imports tooling"]
