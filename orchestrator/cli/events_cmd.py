"""`runctl events RUN_DIR`: what the controller saw and did (events.jsonl), or with --audit who did
what (audit.jsonl); filtered by --type and --since, and followed as it grows with --follow.
Events print as sentences (orchestrator.views.event_text), one line each; --json prints the records.

Both files are written only by the owner's controller (docs/security.md), but their text may
come from other users (a kill reason, a node name): every value goes through `for_terminal`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import time
from pathlib import Path
from typing import Any

from orchestrator.contract import RunPaths, loads_bounded
from orchestrator.contract import events as ev
from orchestrator.contract.audit import AuditRecord
from orchestrator.contract.textsafe import for_terminal
from orchestrator.errors import EXIT_OK, UsageError

FOLLOW_POLL_SECONDS = 1.0
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(subparsers: argparse._SubParsersAction) -> None:
    events = subparsers.add_parser(
        "events",
        help="what the controller saw and did (events.jsonl), or the audit trail",
        description="Print the run's events (events.jsonl: failures, restarts, submissions, kills ...), "
        "oldest first, or with --audit the operator actions the controller authenticated (audit.jsonl). "
        "--type and --since filter; --follow keeps printing new lines until Ctrl-C.",
    )
    events.add_argument("run_dir", help="run directory")
    events.add_argument(
        "--last", type=int, default=20, metavar="N", help="the last N matching lines (default 20; 0: all)"
    )
    events.add_argument("--audit", action="store_true", help="show audit.jsonl (operator actions) instead")
    events.add_argument(
        "--type",
        action="append",
        metavar="TYPE",
        help="only events of this type (repeatable or comma-separated, e.g. failure,restart; "
        "with --audit: the action, e.g. kill)",
    )
    events.add_argument(
        "--since",
        metavar="WHEN",
        help="only newer ones: a duration back from now (90s, 30m, 2h, 1d) or a local time "
        "(14:02, 2026-11-30 14:02, 2026-11-30T14:02:00)",
    )
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until Ctrl-C")
    events.add_argument("--json", action="store_true", help="one JSON object a line")
    events.set_defaults(func=run_events)


def parse_since(text: str, now: float | None = None) -> float:
    """Epoch seconds from `--since` (UsageError naming the value when it is neither form)."""
    now = time.time() if now is None else now
    text = text.strip()
    match = _DURATION.match(text)
    if match:
        return now - float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    today = datetime.datetime.fromtimestamp(now).date()
    for fmt in ("%H:%M", "%H:%M:%S"):
        try:
            clock = datetime.datetime.strptime(text, fmt).time()
        except ValueError:
            continue
        return datetime.datetime.combine(today, clock).timestamp()
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise UsageError(
            f"--since {text!r}: give a duration (90s, 30m, 2h, 1d) or a local time (14:02, 2026-11-30 14:02)"
        ) from None


def _types(values: list[str] | None) -> set[str]:
    return {t.strip() for v in values or [] for t in v.split(",") if t.strip()}


def kind_of(record: Any) -> str:
    """An event's kind, or an audit line's action: what --type matches."""
    if isinstance(record, AuditRecord):
        return record.action
    return record.KIND or getattr(record, "name", "")


def matches(record: Any, types: set[str], since: float | None) -> bool:
    if types and kind_of(record) not in types:
        return False
    if since is not None:
        return record.time is not None and record.time >= since
    return True


def format_record(record: Any) -> str:
    """One record, one line (a reason cannot forge a second one): its local time, then the event as
    a sentence (orchestrator.views.event_text) or the audit line's who, what, verdict and why."""
    from orchestrator.views.event_text import sentence  # noqa: PLC0415 - lazy: +10 ms on every runctl start

    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.time or 0))
    except (TypeError, ValueError, OverflowError, OSError):
        stamp = "????-??-?? ??:??:??"
    if isinstance(record, AuditRecord):
        verdict = "allowed" if record.allowed else "REFUSED"
        user, action, reason = (for_terminal(x) for x in (record.user, record.action, record.reason))
        return f"{stamp}  {user}  {action}  {verdict}  reason: {reason}"
    return f"{stamp}  {sentence(record)}"


class JsonlTail:
    """The complete lines appended to a JSON-lines file since the last call (a half-written last
    line waits for its newline; a file that shrank is read again from the start)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                size = handle.seek(0, 2)
                if size < self.offset:
                    self.offset, self.partial = 0, b""
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        records = []
        for line in lines:
            try:
                record = loads_bounded(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records


def run_events(args: argparse.Namespace) -> int:
    paths = RunPaths.of(args.run_dir)
    if not paths.config.exists():
        raise UsageError(f"{paths.root} is not a run directory (no run.yaml)")
    if args.last < 0:
        raise UsageError(f"--last {args.last}: give 0 (all) or more")
    types = _types(args.type)
    since = parse_since(args.since) if args.since else None
    tail = JsonlTail(paths.audit if args.audit else paths.events)
    parse = AuditRecord.from_dict if args.audit else ev.Event.from_dict
    everything = [parse(r) for r in tail.read()]
    records = [r for r in everything if matches(r, types, since)]
    if args.last:
        records = records[-args.last :]
    for record in records:
        _print(record, args)
    if not records and not args.json:
        print(_nothing(paths, args, everything, types))
    if not args.follow:
        return EXIT_OK
    try:
        while True:
            time.sleep(FOLLOW_POLL_SECONDS)
            for record in map(parse, tail.read()):
                if matches(record, types, since):
                    _print(record, args)
    except KeyboardInterrupt:
        return EXIT_OK


def _print(record: Any, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(record.to_dict(), sort_keys=True, default=str), flush=True)
    else:
        print(format_record(record), flush=True)


def _nothing(paths, args, everything: list[Any], types: set[str]) -> str:
    """Why nothing was printed, in words (an empty screen at 3 a.m. says nothing)."""
    if not everything:
        if args.audit:
            return f"no operator actions recorded ({paths.audit} is empty)"
        return f"no events recorded yet ({paths.events}): has a controller run? `runctl watch {paths.root} --detach`"

    seen = sorted({kind_of(r) for r in everything})
    wanted = f" of type {', '.join(sorted(types))}" if types else ""
    when = f" since {args.since}" if args.since else ""
    return (
        f"no {'operator actions' if args.audit else 'events'}{wanted}{when}; types recorded: "
        + for_terminal(", ".join(seen))
    )
