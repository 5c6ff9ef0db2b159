"""A disk pause in words: the notification the controller sends and the line `runctl status` shows."""

from __future__ import annotations

from orchestrator.contract.disk_space import gib
from orchestrator.contract.state import DiskPause

ADVICE_IN_NOTIFICATION = 5  # paths named in the notification (all of them in state and the event)


def pause_message(pause: DiskPause, cause: str = "") -> str:
    """The pause in words, for the notification and `runctl status`."""
    seen = f" ({cause} in job {pause.job_id} while the disk was full)" if cause and pause.job_id else ""
    head = (
        f"run paused{seen}: {pause.mount} has {gib(pause.free_bytes)} free, the next checkpoint needs "
        f"{gib(pause.needed_bytes)}; nothing is restarted and no node is blamed. "
    )
    if pause.to_delete:
        listed = "; ".join(
            f"{item.get('path')} ({gib(item.get('bytes') or 0)}: {item.get('why')})"
            for item in pause.to_delete[:ADVICE_IN_NOTIFICATION]
        )
        more = len(pause.to_delete) - ADVICE_IN_NOTIFICATION
        head += (
            f"To make room, delete: {listed}"
            + (f"; and {more} more (runctl status)" if more > 0 else "")
            + ". "
        )
    else:
        head += f"Nothing of the run's own can go: free space elsewhere on {pause.mount}. "
    return head + "The run resumes by itself once there is room (checked every pass)"
