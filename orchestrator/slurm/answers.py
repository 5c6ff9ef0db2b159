"""Reading SLURM's answers about jobs, the same way for every release from 22.05 to 25.11.

What differs between releases (docs/slurm.md has the table with where each shape comes from):

| field | 22.05 (v0.0.38) | 23.02 (v0.0.39) | 23.11 .. 25.11 (v0.0.40 .. v0.0.44) |
| --- | --- | --- | --- |
| job_state | "PENDING" | "PENDING" | ["PENDING", "REQUEUED"]: base state and flags |
| exit_code | raw wait status (768) | {set, infinite, number}: raw wait status | {status, return_code: {set, infinite, number}, signal: {id, name}} |
| times | seconds (0: unset) | seconds (0: unset) | {set, infinite, number} |
| release | meta.Slurm.release | meta.Slurm.release | meta.slurm.release |

The text of `squeue -O` is one shape everywhere except `exit_code`: the raw wait status through
25.05, `EXIT:SIGNAL` from 25.11. Times are asked as epoch seconds (SLURM_TIME_FORMAT=%s).

Every reader refuses what it does not understand with `SlurmAnswerError`, naming the field, the
value and the SLURM release: a job is never guessed to have ended from a value we cannot read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from orchestrator.errors import SchedulerError

from .base import SLURM_STATE_TABLE, JobInfo, JobState
from .hostlist import expand_hostlist

# The first release whose `squeue --json` honours --jobs, --name and --states (src/squeue/squeue.c
# calls squeue_filter_jobs_for_json from 24.05; before, --json prints every job slurmctld sent).
JSON_FILTERS_FROM = (24, 5)


def json_filters(release: str) -> bool:
    """Whether `release` ("22.05", "24.11.5") filters its `squeue --json`."""
    major, minor = (int(p) for p in release.split(".")[:2])
    return (major, minor) >= JSON_FILTERS_FROM


# scontrol hold reasons that mean "held", whatever the job state says.
HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})

# SLURM's base job states (JOB_STATE_BASE): exactly one in every answer.
BASE_STATES = frozenset(
    {"PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
     "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)  # fmt: skip
# The flags that change what the job is doing, in the order SLURM's own job_state_string()
# lets them win over the base state (a job COMPLETING after a FAILED base is still completing).
STATE_FLAGS_IN_ORDER = (
    "COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
    "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING",
)  # fmt: skip
# Flags that say something about the job without changing its state (launch failed and it will
# be requeued, accounting to update, nodes powering up, requeue expedited).
INFORMATIONAL_FLAGS = frozenset(
    {"LAUNCH_FAILED", "UPDATE_DB", "RECONFIG_FAIL", "POWER_UP_NODE", "EXPEDITING"}
)
EXIT_STATUSES = frozenset({"SUCCESS", "ERROR", "SIGNALED", "CORE_DUMPED", "PENDING", "INVALID"})
# Text squeue prints these where a time is not set or has no end.
UNSET_TIME_WORDS = frozenset({"", "N/A", "NONE", "UNKNOWN", "INFINITE", "UNLIMITED"})


class SlurmAnswerError(SchedulerError):
    """A field of SLURM's answer this reader does not understand."""

    def __init__(self, field: str, value: Any, release: str, why: str = ""):
        shown = json.dumps(value)[:300] if not isinstance(value, str) else repr(value[:300])
        super().__init__(
            f"cannot read SLURM {release or '(release unknown)'}'s {field}={shown}"
            f"{': ' + why if why else ''}. Nothing was concluded from this answer; if this "
            f"release says it this way, teach orchestrator/slurm/answers.py (and add a fixture "
            f"under tests/slurm/answers/)"
        )
        self.field, self.value, self.release = field, value, release


def read_release(meta: Any) -> str:
    """The SLURM release of a --json answer: meta.Slurm.release (22.05, 23.02) or
    meta.slurm.release (23.11 on); "" when the answer does not say."""
    if not isinstance(meta, dict):
        return ""
    for key in ("slurm", "Slurm"):
        block = meta.get(key)
        if isinstance(block, dict) and isinstance(block.get("release"), str):
            return block["release"]
    return ""


def read_job_state(
    value: Any, reason: str, release: str, priority: int | None = None
) -> tuple[JobState, bool]:
    """(our state, held) from job_state: a string (22.05, 23.02, text) or a list of the base
    state and flags (23.11 on). A pending job is held when its reason says so or, where the
    answer gives it, its priority is 0 (a hold is priority 0 in SLURM; squeue's text prints
    a description such as "job requeued in held state" in place of the reason)."""
    if isinstance(value, str):
        words = value.strip().upper().split("+") if value.strip() else []
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = [w.strip().upper() for w in value]
    else:
        raise SlurmAnswerError("job_state", value, release, "neither a word nor a list of words")
    unknown = [w for w in words if w not in SLURM_STATE_TABLE and w not in INFORMATIONAL_FLAGS]
    if unknown or not words:
        raise SlurmAnswerError(
            "job_state", value, release, f"unknown state {unknown[0]!r}" if unknown else "empty"
        )
    bases = [w for w in words if w in BASE_STATES]
    if isinstance(value, list) and len(bases) != 1:
        raise SlurmAnswerError("job_state", value, release, f"expected one base state, got {bases}")
    flag = next((f for f in STATE_FLAGS_IN_ORDER if f in words), None)
    word = flag or (bases[0] if bases else next(w for w in words if w not in INFORMATIONAL_FLAGS))
    state = SLURM_STATE_TABLE[word]
    # A hold reason outlives the hold: a held job cancelled keeps "JobHeldUser".
    if (reason in HELD_REASONS or priority == 0) and state is JobState.PENDING:
        return JobState.HELD, True
    return state, False


def decode_wait_status(raw: int) -> tuple[int | None, int | None]:
    """A raw wait status (exit code in the high byte, terminating signal in the low 7 bits) as
    (exit_code, signal); a signal gives 128 + N."""
    sig = raw & 0x7F
    if sig:
        return 128 + sig, sig
    return (raw >> 8) & 0xFF, None


def _number(value: Any, field: str, release: str) -> int | None:
    """{set, infinite, number} (or a plain int): the number, None when unset or infinite."""
    if isinstance(value, bool):
        raise SlurmAnswerError(field, value, release, "a boolean where a number belongs")
    if isinstance(value, int):
        return value
    if isinstance(value, dict) and {"set", "number"} <= set(value):
        if value.get("infinite") is True or value.get("set") is False:
            return None
        if isinstance(value["number"], int) and not isinstance(value["number"], bool):
            return value["number"]
    raise SlurmAnswerError(field, value, release, "expected a number or {set, infinite, number}")


def read_exit(value: Any, release: str) -> tuple[int | None, int | None]:
    """(exit_code, signal) from exit_code: a raw wait status (22.05, text through 25.05),
    {set, infinite, number} holding one (23.02), {status, return_code, signal} (23.11 on), or
    text `EXIT:SIGNAL` (25.11). (None, None): not known yet."""
    if value is None or value == "":
        return None, None
    if isinstance(value, str):
        code, colon, sig = value.strip().partition(":")
        if code.isdigit() and (not colon or sig.isdigit()):
            if colon:
                return (128 + int(sig), int(sig)) if int(sig) else (int(code), None)
            return decode_wait_status(int(code))
        raise SlurmAnswerError("exit_code", value, release, "expected a wait status or EXIT:SIGNAL")
    if isinstance(value, dict) and "status" in value:
        status = value["status"]
        words = [status] if isinstance(status, str) else status
        if not isinstance(words, list) or len(words) != 1 or words[0] not in EXIT_STATUSES:
            raise SlurmAnswerError(
                "exit_code.status", status, release, f"expected one of {sorted(EXIT_STATUSES)}"
            )
        if words[0] in ("PENDING", "INVALID"):
            return None, None
        if words[0] in ("SIGNALED", "CORE_DUMPED"):
            signal = value.get("signal")
            sig = _number(
                signal.get("id") if isinstance(signal, dict) else signal, "exit_code.signal.id", release
            )
            if sig is None:
                raise SlurmAnswerError(
                    "exit_code.signal", signal, release, "a signalled exit without a signal"
                )
            return 128 + sig, sig
        code = _number(value.get("return_code"), "exit_code.return_code", release)
        return code, None
    raw = _number(value, "exit_code", release)
    return (None, None) if raw is None else decode_wait_status(raw)


def read_time(value: Any, field: str, release: str) -> float | None:
    """Epoch seconds from an int (0: unset), {set, infinite, number}, null, "Infinity" (the
    data_parser's complex mode), or squeue's text with SLURM_TIME_FORMAT=%s; None: unset/no end."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.upper() in UNSET_TIME_WORDS or text == "Infinity":
            return None
        if text.isdigit():
            return float(text) or None
        raise SlurmAnswerError(field, value, release, "expected epoch seconds (SLURM_TIME_FORMAT=%s)")
    number = _number(value, field, release)
    return float(number) if number else None


def read_nodes(value: Any, release: str) -> list[str]:
    """A host list ("node[01-04]"); empty, null or "(null)"/"None assigned": no nodes."""
    if value is None or value in ("", "(null)", "None assigned"):
        return []
    if not isinstance(value, str):
        raise SlurmAnswerError("nodes", value, release, "expected a host list")
    try:
        return expand_hostlist(value)
    except ValueError as exc:
        raise SlurmAnswerError("nodes", value, release, str(exc)) from None


def read_text(value: Any, field: str, release: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SlurmAnswerError(field, value, release, "expected a string")
    return value


def job_info(
    *, job_id: Any, name: Any, state: Any, reason: Any, exit_code: Any, nodes: Any, user: Any,
    submit: Any, start: Any, end: Any, release: str, priority: int | None = None,
) -> JobInfo:  # fmt: skip
    """One job from its fields, as any answer gives them (JSON values or text words)."""
    if isinstance(job_id, bool) or not (
        isinstance(job_id, int) or (isinstance(job_id, str) and job_id.isdigit())
    ):
        raise SlurmAnswerError("job_id", job_id, release, "expected a number")
    reason_text = read_text(reason, "state_reason", release)
    our_state, held = read_job_state(state, reason_text, release, priority)
    code = signal = None
    if our_state.is_terminal:
        code, signal = read_exit(exit_code, release)
    node_list = read_nodes(nodes, release)
    return JobInfo(
        job_id=str(job_id), name=read_text(name, "name", release), state=our_state, nodes=node_list,
        exit_code=code, signal=signal, reason="" if reason_text == "None" else reason_text,
        # SLURM stamps start_time on a job cancelled while pending, and an expected start on a
        # pending one: a job without nodes never started.
        start_time=read_time(start, "start_time", release) if node_list else None,
        # A running job's end_time is its expected end (start + time limit).
        end_time=read_time(end, "end_time", release) if our_state.is_terminal else None,
        held=held, user=read_text(user, "user_name", release),
        submit_time=read_time(submit, "submit_time", release),
    )  # fmt: skip


def job_from_json(record: Any, release: str) -> JobInfo:
    """One record of `squeue --json`'s jobs, of any release."""
    if not isinstance(record, dict) or "job_id" not in record or "job_state" not in record:
        raise SlurmAnswerError("jobs[]", record, release, "a job record needs job_id and job_state")
    return job_info(
        job_id=record["job_id"], name=record.get("name"), state=record["job_state"],
        reason=record.get("state_reason"), exit_code=record.get("exit_code"), nodes=record.get("nodes"),
        user=record.get("user_name"), submit=record.get("submit_time"), start=record.get("start_time"),
        end=record.get("end_time"), release=release,
    )  # fmt: skip


def jobs_from_json(text: str, show: Callable[[], str]) -> list[JobInfo]:
    """The jobs of a `squeue --json` answer of any release. An answer with `errors` is an outage
    (22.05 exits 0 with errors when slurmctld does not answer), never an empty queue."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise SchedulerError(f"cannot parse squeue's JSON:\n{show()[:4000]}") from None
    if not isinstance(data, dict):
        raise SchedulerError(f"squeue's JSON is not an object:\n{show()[:4000]}")
    if data.get("errors"):
        raise SchedulerError(
            f"squeue answered with errors (slurmctld unreachable?): {errors_text(data['errors'])}"
        )
    records = data.get("jobs")
    if not isinstance(records, list):
        raise SchedulerError(f"squeue's JSON has no list of jobs:\n{show()[:4000]}")
    release = read_release(data.get("meta"))
    return [job_from_json(record, release) for record in records]


# `squeue -h -O` fields, in order; Reason last because it is the only one that may hold spaces.
SQUEUE_FIELDS = ("JobID", "State", "exit_code", "UserName", "SubmitTime", "StartTime", "EndTime",
                 "NodeList", "PriorityLong", "Name", "Reason")  # fmt: skip
SQUEUE_SEPARATOR = "|"
SQUEUE_FORMAT = ",".join(f"{f}:{SQUEUE_SEPARATOR}" for f in SQUEUE_FIELDS)


def jobs_from_text(text: str, release: str) -> list[JobInfo]:
    """`squeue -h -O SQUEUE_FORMAT` (SLURM_TIME_FORMAT=%s): one job a line, each field followed
    by `|`; a reason that holds `|` keeps it (it is last)."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.rstrip().split(SQUEUE_SEPARATOR, len(SQUEUE_FIELDS) - 1)
        if len(parts) != len(SQUEUE_FIELDS) or not parts[-1].endswith(SQUEUE_SEPARATOR):
            raise SlurmAnswerError(
                "squeue line", line, release, f"expected {len(SQUEUE_FIELDS)} fields ending in '|'"
            )
        job_id, state, code, user, submit, start, end, nodes, priority, name, reason = (
            p.strip() for p in parts
        )
        if not priority.isdigit():
            raise SlurmAnswerError("PriorityLong", priority, release, "expected a number")
        out.append(
            job_info(
                job_id=job_id, name=name, state=state, reason=reason[:-1].strip(), exit_code=code,
                nodes=nodes, user=user, submit=submit, start=start, end=end, release=release,
                priority=int(priority),
            )
        )  # fmt: skip
    return out


def errors_text(errors: Any) -> str:
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
