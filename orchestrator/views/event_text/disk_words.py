"""A disk pause in words: the event's sentence, its notification and the line `runctl status`
shows while the run is paused (refreshed every pass) are one wording."""

from __future__ import annotations

from typing import Any

from orchestrator.contract.causes import cause_words
from orchestrator.contract.state import DiskPause
from orchestrator.views.event_text.words import _reason, size

ADVICE_IN_NOTIFICATION = 5  # paths named in the words (all of them in state and the event)


def pause_message(pause: DiskPause, cause: str = "") -> str:
    """The pause as `runctl status` shows it."""
    return pause_words(
        pause.mount, pause.free_bytes, pause.needed_bytes, pause.job_id, cause, pause.to_delete
    )


def pause_words(
    mount: str,
    free_bytes: int | None,
    needed_bytes: int | None,
    job_id: str | None,
    cause: str | None,
    to_delete: list[dict[str, Any]] | None,
) -> str:
    """Also the words of a `disk_full_paused` record, which may be an older one without a field."""
    seen = (
        f" (after {cause_words(cause)} in job {job_id}, while the disk was full)" if cause and job_id else ""
    )
    head = (
        f"run paused{seen}: {mount} has {size(free_bytes)} free, the next checkpoint needs "
        f"{size(needed_bytes)}; nothing is restarted and no node is blamed. "
    )
    items = [item for item in to_delete or [] if isinstance(item, dict) and item.get("path")]
    if items:
        listed = "; ".join(
            f"{item['path']} ({size(item.get('bytes'))}{_reason(item.get('why'))})"
            for item in items[:ADVICE_IN_NOTIFICATION]
        )
        more = len(items) - ADVICE_IN_NOTIFICATION
        head += (
            f"To make room, delete: {listed}"
            + (f"; and {more} more (runctl status)" if more > 0 else "")
            + ". "
        )
    else:
        head += f"Nothing of the run's own can go: free space elsewhere on {mount}. "
    return head + "The run resumes by itself once there is room (checked every pass)"
