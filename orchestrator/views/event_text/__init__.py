"""Events as sentences for people: one function per event kind (contract.events), used by
`runctl status`, `runctl events`, the `watch --plain` log and the demo.

    sentence(event)                 "node17 lost in job 4207 (no beat for 212 s, dead after 210 s)"
    clock(event.time, now)          "14:02" today, "11-29 14:02" another day (local time)

The JSON (`runctl events --json`) stays the raw record; a sentence never shows a dict. Every
value in a sentence may come from another user (a kill reason, a node name), so the whole
sentence goes through `for_terminal`: one event is one line, with no control character.
tests/unit/test_event_text.py checks that every kind has a sentence.
"""

from __future__ import annotations

from orchestrator.views.event_text.registry import SENTENCES, sentence
from orchestrator.views.event_text.words import (
    OUTCOME_WORDS,
    clock,
    duration,
    hosts,
    outcome_words,
    size,
)

# Each sentence module registers its kinds on import (tests/unit/test_event_text.py checks that
# every kind has one).
from . import aux_sentences, health_pool_sentences, operator_sentences, run_sentences  # noqa: F401

__all__ = [
    "OUTCOME_WORDS",
    "SENTENCES",
    "clock",
    "duration",
    "hosts",
    "outcome_words",
    "sentence",
    "size",
]
