"""Causes and notification kinds are compared and passed as members of the contract's enums
(orchestrator/contract/causes.py `Cause`, severity.py `Notice`), never spelled as strings:
one spelling means grep finds every place a fault class is handled, and a typo is an error at
import, not a branch that never runs. Read with ast from orchestrator/ and simulation/: a string
equal to a cause or a notice is refused where code uses it as one: compared (==, !=, in), or
passed to a call. Field names that happen to share a spelling (`view.get("straggler")`) and an
event's own KIND are not uses of the vocabulary."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator.contract.causes import Cause
from orchestrator.contract.severity import Notice

REPO = Path(__file__).resolve().parents[2]
CAUSES = {c.value for c in Cause}
NOTICES = {n.value for n in Notice}
# Where a notice kind is an argument ("restart", "kill", "disk" are also plain words elsewhere).
NOTICE_CALLS = {"Notify", "Stop", "notify", "severity_of", "destinations"}
DECLARED_IN = {"orchestrator/contract/causes.py", "orchestrator/contract/severity.py"}
FIELD_READS = {"get", "pop", "setdefault"}  # a dict's field, not a cause


def spelled(node: ast.AST, vocabulary: set[str]) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in vocabulary:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for element in node.elts for s in spelled(element, vocabulary)]
    if isinstance(node, ast.IfExp):
        return spelled(node.body, vocabulary) + spelled(node.orelse, vocabulary)
    return []


def called(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def uses_in(source: str, filename: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                found += [f"{filename}:{node.lineno}: compares {s!r}" for s in spelled(operand, CAUSES)]
        elif isinstance(node, ast.Call) and called(node) not in FIELD_READS:
            vocabulary = CAUSES | NOTICES if called(node) in NOTICE_CALLS else CAUSES
            for argument in [*node.args, *(k.value for k in node.keywords)]:
                found += [f"{filename}:{node.lineno}: passes {s!r}" for s in spelled(argument, vocabulary)]
    return found


def test_no_cause_or_notice_spelled_as_a_string():
    problems = []
    for package in ("orchestrator", "simulation"):
        for path in sorted((REPO / package).rglob("*.py")):
            name = str(path.relative_to(REPO))
            if name not in DECLARED_IN:
                problems += uses_in(path.read_text(), name)
    assert not problems, "use Cause.X / Notice.X:\n" + "\n".join(problems)


def test_the_check_finds_a_planted_string():
    planted = (
        'if failure.cause == "hang":\n    actions.append(Notify("failure", text))\n'
        'view.get("straggler")\nparser.add_parser("restart")\n'
    )
    assert uses_in(planted, "planted.py") == [
        "planted.py:1: compares 'hang'",
        "planted.py:2: passes 'failure'",
    ]


def test_every_cause_has_its_row_and_every_notice_its_severity():
    from orchestrator.contract.causes import RESPONSES
    from orchestrator.contract.severity import SEVERITY

    assert set(RESPONSES) == set(Cause)
    assert set(SEVERITY) == set(Notice)
