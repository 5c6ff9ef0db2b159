"""The registry of event sentences: one function per event kind (contract.events and its
siblings), registered with @says(Kind); `sentence(event)` words any event on one line."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from orchestrator.contract import events as ev
from orchestrator.contract.textsafe import for_terminal

E = TypeVar("E", bound=ev.Event)
SENTENCES: dict[type[ev.Event], Callable[[Any], str]] = {}


def says(kind: type[E]) -> Callable[[Callable[[E], str]], Callable[[E], str]]:
    def register(function: Callable[[E], str]) -> Callable[[E], str]:
        SENTENCES[kind] = function
        return function

    return register


def sentence(event: ev.Event) -> str:
    """The event in words, on one line."""
    return for_terminal(SENTENCES[type(event)](_filled(event)))


def _filled(event: E) -> E:
    """A line written before a field existed reads that field as None (contract.events): an
    unknown text becomes "?", an unknown list or mapping an empty one; numbers stay None and each
    sentence words them ("?")."""
    blanks: dict[str, Any] = {}
    for spec in dataclasses.fields(event):
        if getattr(event, spec.name) is not None or spec.name == "time":
            continue
        kind = str(spec.type)
        if kind == "str":
            blanks[spec.name] = "?"
        elif kind.startswith("list["):
            blanks[spec.name] = []
        elif kind.startswith("dict["):
            blanks[spec.name] = {}
    return dataclasses.replace(event, **blanks) if blanks else event
