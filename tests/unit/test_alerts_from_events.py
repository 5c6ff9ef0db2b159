"""Operator text is written once: a policy's alert is its event's sentence (actions.alert), so the
pager says what `runctl events` and `runctl status` say. No controller module builds a Notify of
its own words; the alerts of the pass's bookkeeping are checked against their events."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator.contract.disk_space import DiskCheck
from orchestrator.contract.manifest import DamageReport
from orchestrator.contract.severity import Notice
from orchestrator.controller import upkeep
from orchestrator.controller.actions import Notify, Record
from orchestrator.views.event_text import sentence

CONTROLLER = Path(__file__).resolve().parents[2] / "orchestrator" / "controller"


def test_no_controller_module_words_a_notification_of_its_own():
    built = []
    for path in sorted(CONTROLLER.glob("*.py")):
        if path.name == "actions.py":  # alert() itself
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Notify":
                built.append(f"{path.name}:{node.lineno}")
    assert built == [], f"Notify built by hand (word it from its event: actions.alert): {built}"


def said(actions) -> list[tuple[str, str]]:
    """(notice kind, text) of each Notify, checked to be the sentence of the event recorded with it."""
    records = [a.event for a in actions if isinstance(a, Record)]
    notes = [a for a in actions if isinstance(a, Notify)]
    assert [n.message for n in notes] == [sentence(e) for e in records[: len(notes)]]
    return [(str(n.kind), n.message) for n in notes]


def test_the_bookkeepings_alerts_are_their_events_sentences():
    problems = [f"/runs/tr11/{name} is group-writable: chmod g-w it" for name in ("a", "b", "c", "d")]
    [(kind, text)] = said(upkeep.trust_lost(["1001"], problems))
    assert kind == Notice.FAILURE and text.endswith("; and 1 more (events.jsonl)") and "/runs/tr11/d" not in text
    [(kind, text)] = said(upkeep.damage_reports([DamageReport("step_0000010", ["sha256 mismatch"], "1001")], 0))
    assert kind == Notice.FAILURE and "resumed from an older one" in text
    full = DiskCheck("critical", 1 << 30, 2 << 30, "the last checkpoint's size", "/ckpt", "/ckpt")
    [(kind, text)] = said(upkeep.disk_level(full, "ok"))
    assert kind == Notice.DISK and text.startswith("checkpoint disk critical: ")
    assert said(upkeep.disk_level(full, "ok", paused=True)) == [], "the pause has said it"
