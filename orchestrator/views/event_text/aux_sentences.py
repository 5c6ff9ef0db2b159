"""Sentences of auxiliary jobs, and of an event kind this runctl does not know."""

from __future__ import annotations

from orchestrator.contract import events as ev
from orchestrator.views.event_text.registry import says
from orchestrator.views.event_text.words import duration


# -- auxiliary jobs -------------------------------------------------------------------------------------
@says(ev.AuxSubmitted)
def _(e: ev.AuxSubmitted) -> str:
    log = f"; log {e.log}" if e.log else ""
    return f"{e.kind} job {e.job_id} submitted by {e.user} ({e.where}){log}"


@says(ev.AuxFinished)
def _(e: ev.AuxFinished) -> str:
    took = f" in {duration(e.seconds)}" if e.seconds is not None else ""
    return f"{e.kind} job {e.job_id} finished{took}"


@says(ev.AuxFailed)
def _(e: ev.AuxFailed) -> str:
    log = e.error_log or e.log
    return f"{e.kind} job {e.job_id} failed: {e.error or e.state or 'no error text'}{f'; log {log}' if log else ''}"


@says(ev.AuxDetached)
def _(e: ev.AuxDetached) -> str:
    log = f"; log {e.log}" if e.log else ""
    return f"stopped waiting for {e.kind} job {e.job_id}: it runs on{log}"


@says(ev.UnknownEvent)
def _(e: ev.UnknownEvent) -> str:
    names = ", ".join(sorted(k for k in e.fields if k not in ("time", "version")))
    return f"{e.name} (a kind this runctl does not know; fields: {names or 'none'}; --json shows them)"
