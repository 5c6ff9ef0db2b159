"""Who must hear of what: every notification kind and its severity, declared once.

- page: a person must act now (the run stopped on its own, or cannot go on without one);
- chat: the controller handled it (a failure restarted, a hang, a straggler, fewer spares):
  the team reads it in its channel, nobody is woken;
- info: a stop or an end a person asked for or expects (a kill, the run finished).

`notifications` (orchestrator/controller/notify.py) routes by it: `page:` URLs get pages, `chat:` URLs get
chat and pages, `urls` everything. apprise's notify type follows it. A
run's stop is a page when it stopped on its own (kinds crash_loop and stopped: config error,
paused for health), info when an operator asked (kill) or it finished. `runctl doctor` fails on the same stops
(`NEEDS_A_PERSON`), and deploy/prometheus/runctl-alerts.yml has a rule for each.
"""

from __future__ import annotations

import enum

from .state import RunStatus


class Severity(str, enum.Enum):
    PAGE = "page"
    CHAT = "chat"
    INFO = "info"

    def __str__(self) -> str:
        return self.value

    @property
    def rank(self) -> int:
        """Higher is more urgent: a destination takes a severity and everything above it."""
        return {Severity.INFO: 0, Severity.CHAT: 1, Severity.PAGE: 2}[self]


class Notice(str, enum.Enum):
    """Every kind a notification may have (config `notifications.events` lists a subset), in the
    order the config reference shows them."""

    FAILURE = "failure"  # a job or launch failed: the controller restarts it
    HANG = "hang"  # ranks stopped progressing: cancelled and restarted
    RESTART = "restart"
    KILL = "kill"  # an operator's kill switch stopped the run
    CRASH_LOOP = "crash_loop"  # restarts without a new checkpoint: stopped
    STOPPED = "stopped"  # stopped on its own: config error, paused for training health
    FINISH = "finish"
    DISK = "disk"  # the next checkpoint does not fit, or state.json cannot be written
    DISK_LOW = "disk_low"  # the disk is getting full: room for the next save still
    STRAGGLER = "straggler"
    HEALTH = "health"  # training-health findings and rollbacks the controller handles
    POOL = "pool"  # fewer usable nodes than the job's: the next job cannot start
    SPARES = "spares"  # the next job asks for fewer spares: it starts, with less room
    DOCTOR = "doctor"  # `runctl doctor` (cron) found a problem: nobody supervises, or it stopped

    def __str__(self) -> str:
        return self.value


SEVERITY: dict[Notice, Severity] = {
    Notice.FAILURE: Severity.CHAT,
    Notice.HANG: Severity.CHAT,
    Notice.RESTART: Severity.CHAT,
    Notice.KILL: Severity.INFO,
    Notice.CRASH_LOOP: Severity.PAGE,
    Notice.STOPPED: Severity.PAGE,
    Notice.FINISH: Severity.INFO,
    Notice.DISK: Severity.PAGE,
    Notice.DISK_LOW: Severity.CHAT,
    Notice.STRAGGLER: Severity.CHAT,
    Notice.HEALTH: Severity.CHAT,
    Notice.POOL: Severity.PAGE,
    Notice.SPARES: Severity.CHAT,
    Notice.DOCTOR: Severity.PAGE,
}
NOTIFICATION_KINDS = tuple(n.value for n in Notice)

# The statuses a run stops in on its own: a person must look before it trains again.
NEEDS_A_PERSON = frozenset({RunStatus.CRASH_LOOP, RunStatus.CONFIG_ERROR, RunStatus.PAUSED})


def severity_of(kind: str) -> Severity:
    """The severity of a notification kind; an unknown kind is a bug, said with the fix."""
    try:
        return SEVERITY[Notice(kind)]
    except ValueError:
        raise ValueError(
            f"notification kind {kind!r} has no severity: add it to orchestrator/contract/severity.py"
        ) from None
