"""Reading SLURM's answers that must never be mistaken for good news.

- `squeue --json`: slurmctld not answering is not an empty queue. Slurm 22.05's squeue, with
  slurmctld stopped, waits ~30 s and exits 0 with `"errors": [{"source": "slurm_load_jobs", ...}]`
  and `"jobs": []`. Any entry in `errors` makes the whole answer an outage (SchedulerError), so
  that no job is ever judged ended from it.
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

from .base import NodeInfo

NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
STATE_WORD = re.compile(r"^[A-Z_]{1,32}$")
MAX_REASON = 300
MAX_NODES = 100_000


def squeue_records(text: str, show: Callable[[], str]) -> list[dict[str, Any]]:
    """The job records of a `squeue --json` answer; SchedulerError when it carries errors or is
    not the expected shape (`show()` describes the command and its output)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise SchedulerError(f"cannot parse squeue's JSON:\n{show()[:4000]}") from None
    if not isinstance(data, dict):
        raise SchedulerError(f"squeue's JSON is not an object:\n{show()[:4000]}")
    errors = data.get("errors")
    if errors:
        # slurmctld did not answer (or answered in part): an outage, never an empty queue.
        raise SchedulerError(f"squeue answered with errors (slurmctld unreachable?): {_errors_text(errors)}")
    records = data.get("jobs")
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise SchedulerError(f"squeue's JSON has no list of jobs:\n{show()[:4000]}")
    return records


def _errors_text(errors: Any) -> str:
    items = errors if isinstance(errors, list) else [errors]
    parts = []
    for item in items[:5]:
        if isinstance(item, dict):
            parts.append(
                " ".join(f"{k}={str(item[k])[:120]!r}" for k in ("source", "error", "errno") if k in item)
            )
        else:
            parts.append(repr(item)[:200])
    return "; ".join(parts) or repr(errors)[:300]


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
        raise SchedulerError(f"scontrol show node answered with errors: {_errors_text(data.get('errors'))}")
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


def _pairs(line: str) -> dict[str, str]:
    """Key=Value pairs of one line; a value may hold spaces (Reason, OS), so a new key starts only
    at ` Key=` with a known-looking key; Reason, last in 22.05, takes the rest of the line."""
    head, sep, reason = line.partition(" Reason=")
    out: dict[str, str] = {}
    for part in re.split(r" (?=[A-Za-z][A-Za-z0-9/:_]*=)", head.strip()):
        key, _, value = part.partition("=")
        out.setdefault(key, value)
    if sep:
        out["Reason"] = reason.strip()
    return out
