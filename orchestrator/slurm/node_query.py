"""Reading SLURM's answers about nodes (its answers about jobs: `answers`).

- `scontrol show node` (--json where the installed SLURM has it, else `-o`, one node a line):
  each node's state words, reason and partitions. The text is slurmctld's, but a reason is
  whatever an admin typed: names are checked against SLURM's node-name rule, every value is
  bounded, and a line that does not parse is skipped, never guessed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from orchestrator.errors import SchedulerError

from .answers import errors_text
from .base import NodeInfo

NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
STATE_WORD = re.compile(r"^[A-Z_]{1,32}$")
MAX_REASON = 300
MAX_NODES = 100_000


def _states(words: Any) -> frozenset[str]:
    """State words, upper case, without the one-character suffixes sinfo adds (`*` not
    responding, `~` powered off, ...); anything else that is not a plain word is dropped."""
    if isinstance(words, str):
        words = re.split(r"[+,\s]+", words)
    if not isinstance(words, list):
        return frozenset()
    cleaned = (w.strip().upper().rstrip("*~#!%$@^-") for w in words if isinstance(w, str))
    return frozenset(w for w in cleaned if STATE_WORD.match(w))


def _reason(value: Any) -> str:
    text = value if isinstance(value, str) else ""
    return "".join(ch if ch.isprintable() else "?" for ch in text)[:MAX_REASON]


def _partitions(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list):
        return ()
    return tuple(p for p in value if isinstance(p, str) and NODE_NAME.match(p))[:64]


def nodes_from_json(text: str, show: Callable[[], str]) -> dict[str, NodeInfo]:
    """`scontrol show node --json` (22.05: {"nodes": [{"name", "state", "state_flags", "reason",
    "partitions"}, ...]}; newer: "state" is a list of words)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise SchedulerError(f"cannot parse scontrol's node JSON:\n{show()[:2000]}") from None
    if not isinstance(data, dict) or data.get("errors"):
        raise SchedulerError(f"scontrol show node answered with errors: {errors_text(data.get('errors'))}")
    records = data.get("nodes")
    if not isinstance(records, list):
        raise SchedulerError(f"scontrol's node JSON has no list of nodes:\n{show()[:2000]}")
    out: dict[str, NodeInfo] = {}
    for record in records[:MAX_NODES]:
        if not isinstance(record, dict):
            continue
        name = record.get("name")
        if not isinstance(name, str) or not NODE_NAME.match(name):
            continue
        state = record.get("state")
        words = [state] if isinstance(state, str) else state if isinstance(state, list) else []
        flags = record.get("state_flags")
        words = [*words, *(flags if isinstance(flags, list) else [])]
        out[name] = NodeInfo(
            name, _states([w for w in words if isinstance(w, str)]), _reason(record.get("reason")),
            _partitions(record.get("partitions")),
        )  # fmt: skip
    return out


def nodes_from_text(text: str) -> dict[str, NodeInfo]:
    """`scontrol show node -o`: one node a line, `Key=Value` pairs; Reason's value runs to the
    end of the line in 22.05 ("Reason=disk errors [root@2026-01-01T10:00:00]")."""
    out: dict[str, NodeInfo] = {}
    for line in text.splitlines()[:MAX_NODES]:
        fields = _pairs(line)
        name = fields.get("NodeName", "")
        if not NODE_NAME.match(name):
            continue
        out[name] = NodeInfo(
            name, _states(fields.get("State", "")), _reason(fields.get("Reason", "")),
            _partitions(fields.get("Partitions", "")),
        )  # fmt: skip
    return out


# Keys 24.11 prints after Reason on the same `-o` line (22.05 ends the line with Reason).
AFTER_REASON = re.compile(r" (?:Comment|Extra|InstanceId|InstanceType|ReservationName)=")


def _pairs(line: str) -> dict[str, str]:
    """Key=Value pairs of one line. A value may hold spaces (Reason, OS), so a new key starts only
    at whitespace followed by `Key=`; SLURM puts one or two spaces between pairs (`Partitions=debug
    BootTime=` has two on 22.05 and 24.11), so values are stripped. Reason, an admin's free text,
    runs to the end of the line or to a key 24.11 prints after it."""
    head, sep, reason = line.partition(" Reason=")
    if sep:
        after = AFTER_REASON.search(reason)
        if after:
            head, reason = f"{head} {reason[after.start() :]}", reason[: after.start()]
    out: dict[str, str] = {}
    for part in re.split(r"\s+(?=[A-Za-z][A-Za-z0-9/:_]*=)", head.strip()):
        key, _, value = part.partition("=")
        out.setdefault(key, value.strip())
    if sep:
        out["Reason"] = reason.strip()
    return out
