"""How each SLURM release from 22.05 to 25.11 says one job, for the mocked SLURM (which answers
in the shape of `RUNCTL_MOCK_SLURM_RELEASE`) and for writing the recorded fixtures of
tests/slurm/answers/. NOT SLURM: a model of its output, taken from SchedMD's sources
(src/plugins/data_parser/v0.0.3x-4x/parsers.c, src/interfaces/data_parser.c,
src/squeue/print.c) and, for 22.05, from the real local cluster. docs/slurm.md has the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# release -> the data_parser (or openapi plugin, 22.05) its `--json` speaks.
DATA_PARSERS = {
    "22.05": "v0.0.38", "23.02": "v0.0.39", "23.11": "v0.0.40", "24.05": "v0.0.41",
    "24.11": "v0.0.42", "25.05": "v0.0.43", "25.11": "v0.0.44",
}  # fmt: skip
RELEASES = tuple(DATA_PARSERS)
FULL_RELEASE = {"22.05": "22.05.8", "23.02": "23.02.8", "23.11": "23.11.10", "24.05": "24.05.8",
                "24.11": "24.11.5", "25.05": "25.05.3", "25.11": "25.11.1"}  # fmt: skip
DEFAULT_RELEASE = "22.05"
INFINITE = -1  # a time with no end (SLURM's INFINITE)
NO_VAL = None  # an exit status not known yet (SLURM's NO_VAL)


def check_release(release: str) -> str:
    if release not in DATA_PARSERS:
        raise ValueError(f"unknown SLURM release {release!r}: choose one of {', '.join(RELEASES)}")
    return release


@dataclass(frozen=True)
class ModelJob:
    """One job as slurmctld holds it: base state and flags, the raw wait status, epoch times
    (0 unset, INFINITE no end)."""

    job_id: int
    name: str
    user: str
    state: str
    flags: tuple[str, ...] = ()
    reason: str = "None"
    raw_exit: int | None = 0
    nodes: str = ""
    submit: int = 0
    start: int = 0
    end: int = 0


def _old_state(job: ModelJob) -> str:
    """22.05 and 23.02 print one word: the first flag SLURM lets win, else the base state."""
    order = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED",
             "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING")  # fmt: skip
    return next((f for f in order if f in job.flags), job.state)


def _no_val(number: int | None) -> dict[str, Any]:
    if number is None:
        return {"set": False, "infinite": False, "number": 0}
    if number == INFINITE:
        return {"set": False, "infinite": True, "number": 0}
    return {"set": True, "infinite": False, "number": number}


def _verbose_exit(raw: int | None, release: str) -> dict[str, Any]:
    """PROCESS_EXIT_CODE (v0.0.40 on): the wait status taken apart. `status` is one flag: a
    string in the v0.0.40/41 sources, a list on 24.11 as measured there, a list from v0.0.43."""
    status, code, sig = "INVALID", None, None
    if raw is None:
        status = "PENDING"
    elif raw & 0x7F:
        status, sig = "SIGNALED", raw & 0x7F
    else:
        code = (raw >> 8) & 0xFF
        status = "ERROR" if code else "SUCCESS"
    names = {9: "KILL", 15: "TERM", 6: "ABRT", 11: "SEGV"}
    return {
        "status": status if release in ("23.11", "24.05") else [status],
        "return_code": _no_val(code),
        "signal": {"id": _no_val(sig), "name": names.get(sig, "") if sig else ""},
    }


def json_job(job: ModelJob, release: str) -> dict[str, Any]:
    """The fields of one `squeue --json` job record that we read, in `release`'s shape."""
    modern = release not in ("22.05", "23.02")

    def stamp(value: int) -> Any:
        if modern:
            return _no_val(value if value else None)
        return 0 if value == INFINITE else value

    if release == "22.05":
        exit_code: Any = job.raw_exit or 0
    elif release == "23.02":
        exit_code = _no_val(job.raw_exit)
    else:
        exit_code = _verbose_exit(job.raw_exit, release)
    return {
        "job_id": job.job_id, "name": job.name, "user_name": job.user,
        "job_state": [job.state, *job.flags] if modern else _old_state(job),
        "state_reason": job.reason, "exit_code": exit_code, "nodes": job.nodes,
        "submit_time": stamp(job.submit), "start_time": stamp(job.start), "end_time": stamp(job.end),
    }  # fmt: skip


def json_meta(release: str, command: list[str]) -> dict[str, Any]:
    """meta of a `--json` answer: where the release is said changed in 23.02 and 23.11."""
    full = FULL_RELEASE[release]
    major, minor, micro = (int(p) for p in full.split("."))
    version = {"major": major, "micro": micro, "minor": minor}
    parser = DATA_PARSERS[release]
    if release == "22.05":
        return {"plugin": {"type": f"openapi/{parser}", "name": f"Slurm OpenAPI {parser}"},
                "Slurm": {"version": version, "release": full}}  # fmt: skip
    if release == "23.02":
        return {"plugins": {"data_parser": f"data_parser/{parser}", "accounting_storage": ""},
                "command": command, "Slurm": {"version": version, "release": full}}  # fmt: skip
    return {
        "plugin": {"type": "", "name": "", "data_parser": f"data_parser/{parser}", "accounting_storage": ""},
        "client": {"source": "/dev/pts/0", "user": "root", "group": "root"}, "command": command,
        "slurm": {"version": {k: str(v) for k, v in version.items()} if release == "23.11" else version,
                  "release": full, "cluster": "runctl"},
    }  # fmt: skip


def json_answer(jobs: list[ModelJob], release: str, command: list[str]) -> dict[str, Any]:
    answer: dict[str, Any] = {"meta": json_meta(release, command), "errors": [], "warnings": []}
    if release == "22.05":
        del answer["warnings"]
    answer["jobs"] = [json_job(job, release) for job in jobs]
    return answer


def text_exit(raw: int | None, release: str) -> str:
    """squeue -O exit_code: the raw wait status through 25.05; `EXIT:SIGNAL` from 25.11
    (nothing when not known)."""
    if release != "25.11":
        return str(raw or 0)
    if raw is None:
        return ""
    return f"0:{raw & 0x7F}" if raw & 0x7F else f"{(raw >> 8) & 0xFF}:0"


def text_time(value: int) -> str:
    """squeue's time with SLURM_TIME_FORMAT=%s: epoch seconds, N/A unset, NONE no end."""
    if value == INFINITE:
        return "NONE"
    return str(value) if value else "N/A"


def text_line(job: ModelJob, release: str) -> str:
    """One line of `squeue -h -O` with answers.SQUEUE_FORMAT."""
    fields = [str(job.job_id), _old_state(job), text_exit(job.raw_exit, release), job.user,
              text_time(job.submit), text_time(job.start), text_time(job.end), job.nodes,
              "0" if job.reason in ("JobHeldUser", "JobHeldAdmin") else "4294901751", job.name,
              job.reason]  # fmt: skip
    return "".join(f"{f}|" for f in fields)
