"""The one registry of rejection reasons (node/reasons.py): nothing is counted, exported or reported that it lacks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from swarm_node.node import reasons
from swarm_node.node.reasons import Rejections, UnknownReason
from swarm_node.protocol.errors import REASONS as PROTOCOL_REASONS

PKG = Path(reasons.__file__).resolve().parents[1]
ROOT = PKG.parent


def test_counting_a_reason_the_registry_lacks_fails() -> None:
    r = Rejections()
    r["task_mismatch"] += 1
    r.add("protocol:schema", 2)
    r.update({"swarm:stream_error": 1, "params:not_finite": 1})
    r.update(["share_capped", "share_capped"])
    assert dict(r) == {"task_mismatch": 1, "protocol:schema": 2, "swarm:stream_error": 1, "params:not_finite": 1,
                       "share_capped": 2}
    for bad in ("stale", "made_up", "protocol:made_up", "params:made_up", "swarm:", "swarm:a b", "other:x"):
        with pytest.raises(UnknownReason):
            Rejections().add(bad)
        with pytest.raises(UnknownReason):
            Rejections({bad: 1})
        assert not reasons.known(bad) and reasons.describe(bad) == ""


def test_counts_handed_up_by_the_swarm_keep_known_names_and_never_raise() -> None:
    got = reasons.from_swarm({"timeout": 3, "digest_mismatch": 1, "made_up": 2},
                             {"protocol:schema": 2, "round_mismatch": 1, "not_ours": 4})
    # the swarm's own names under swarm:, the validator's as they are; a name neither registry knows is the
    # swarm's reason for a misbehaving validator, never an exception in the round
    assert dict(got) == {"swarm:timeout": 3, "swarm:digest_mismatch": 1, "protocol:schema": 2,
                         "round_mismatch": 1, "swarm:validate_error": 6}


def _reason_literals(path: Path) -> list[tuple[int, str]]:
    """String literals this module counts as rejection reasons: subscripts of a counter whose name has `rej`
    in it, `.add("...")` on such a counter, and the reason slot of a `return None, "reason", detail` of a check."""
    tree = ast.parse(path.read_text())
    found = []

    def names_a_counter(node: ast.AST) -> bool:  # rejected, out.rejected, info["rejected"]
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            return "rej" in str(node.slice.value)
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        return "rej" in name

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and names_a_counter(node.value):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                found.append((node.lineno, node.slice.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add"
              and names_a_counter(node.func.value) and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, node.args[0].value))
        elif (isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and len(node.value.elts) == 3
              and isinstance(node.value.elts[0], ast.Constant) and node.value.elts[0].value is None
              and isinstance(node.value.elts[1], ast.Constant) and isinstance(node.value.elts[1].value, str)):
            found.append((node.lineno, node.value.elts[1].value))
    return found


def test_every_reason_the_node_code_names_is_registered() -> None:
    files = sorted(p for d in ("node", "grpo", "dpo") for p in (PKG / d).glob("*.py"))
    literals = {f"{p.parent.name}/{p.name}": _reason_literals(p) for p in files}
    assert sum(map(len, literals.values())) >= 15, literals  # the scan sees the admission code at all
    missing = [(f, line, r) for f, found in literals.items() for line, r in found if not reasons.known(r)]
    assert missing == []
    named = {r for found in literals.values() for _line, r in found}
    assert set(reasons.REASONS) <= named  # and the registry lists no dead name (as `stale` was)


def test_the_params_family_is_what_decode_params_raises() -> None:
    raised = set()
    # the codec (swarm/averaging/payload.py) and robust averaging (dpo/robust.py)
    for path in [*(PKG / "swarm" / "averaging").glob("*.py"), *(PKG / "dpo").glob("*.py")]:
        raised |= {n.args[0].value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                   and isinstance(n.func, (ast.Name, ast.Attribute))
                   and (n.func.id if isinstance(n.func, ast.Name) else n.func.attr) == "PayloadError"
                   and n.args and isinstance(n.args[0], ast.Constant)}
    assert raised == set(reasons.PARAM_REASONS)


def test_every_reason_has_a_meaning_and_the_docs_list_the_nodes_own() -> None:
    docs = (ROOT / "docs" / "protocol.md").read_text()
    for r in reasons.REASONS:
        assert reasons.describe(r), r
        assert f"`{r}`" in docs, f"docs/protocol.md does not list {r}"
    assert all(reasons.describe(f"protocol:{r}") for r in PROTOCOL_REASONS)
    assert "wire decoder" in reasons.describe("protocol:schema")
    assert "architecture" in reasons.describe("params:arch_mismatch")
