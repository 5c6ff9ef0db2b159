"""The jobs of a run as the login node knows them, written only by the owner's runctl/controller:

jobs/submissions.jsonl   one `Submission` per sbatch, append-only (the ledger)
jobs/last_seen.json      per job, the last state the scheduler reported (`LastSeen`): SLURM
                         forgets ended jobs, and the local cluster has no accounting
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .files import append_jsonl, atomic_write_json, read_json, read_jsonl
from .values import int_or_none, number_or_none


def _text(value: Any, default: str = "") -> str:
    return default if value is None else str(value)


@dataclass(frozen=True)
class Submission:
    job_id: str
    time: float
    reason: str = ""
    exclude: list[str] = field(default_factory=list)
    chain_index: int = 0
    user: str = ""
    scheduler: str = ""  # the backend's name (slurm, mock): `runctl watch` uses the same
    script: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Submission | None:
        if data.get("job_id") is None:
            return None
        exclude = data.get("exclude") if isinstance(data.get("exclude"), list) else []
        index = data.get("chain_index")
        return cls(
            job_id=str(data["job_id"]),
            time=number_or_none(data.get("time")) or 0.0,
            reason=_text(data.get("reason")),
            exclude=[str(n) for n in exclude],
            chain_index=int_or_none(index) or 0,
            user=_text(data.get("user")),
            scheduler=_text(data.get("scheduler")),
            script=_text(data.get("script")),
        )


def append_submission(path: Path, submission: Submission) -> None:
    append_jsonl(path, asdict(submission))


def read_submissions(path: Path) -> list[Submission]:
    return [s for s in (Submission.from_dict(r) for r in read_jsonl(path)) if s is not None]


@dataclass(frozen=True)
class LastSeen:
    state: str  # a JobState value
    exit_code: int | None = None
    nodes: list[str] = field(default_factory=list)
    reason: str = ""
    started_at: float | None = None
    ended_at: float | None = None
    seen_at: float = field(default_factory=time.time)

    @classmethod
    def from_dict(cls, data: Any) -> LastSeen | None:
        if not isinstance(data, dict) or not isinstance(data.get("state"), str):
            return None
        code = data.get("exit_code")
        nodes = data.get("nodes") if isinstance(data.get("nodes"), list) else []
        return cls(
            state=data["state"],
            exit_code=int_or_none(code),
            nodes=[str(n) for n in nodes],
            reason=_text(data.get("reason")),
            started_at=number_or_none(data.get("started_at")),
            ended_at=number_or_none(data.get("ended_at")),
            seen_at=number_or_none(data.get("seen_at")) or 0.0,
        )


def read_last_seen(path: Path) -> dict[str, LastSeen]:
    try:
        data = read_json(path)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    seen = {str(job): LastSeen.from_dict(entry) for job, entry in data.items()}
    return {job: entry for job, entry in seen.items() if entry is not None}


def write_last_seen(path: Path, seen: dict[str, LastSeen]) -> None:
    atomic_write_json(path, {job: asdict(entry) for job, entry in seen.items()})
