"""Command-line emulation of SLURM's tools over the mocked SLURM. NOT SLURM.

python -m orchestrator.slurm.mock shim-dir DIR [--state STATE_DIR] [--execute]
    write sbatch/squeue/scontrol/scancel/sacct/srun shims into DIR (put DIR first on PATH)
python -m orchestrator.slurm.mock_cli {sbatch|squeue|scontrol|scancel|sacct|srun} ARGS...
    what each shim runs; the output imitates SLURM closely enough for `SlurmScheduler` and for
    scripts that read `sbatch --parsable`, `squeue --json`, `squeue -h -o FORMAT`,
    `squeue -h -O answers.SQUEUE_FORMAT`, `scontrol show job -o`, `sacct -n -P -o ...`.
    `squeue --json`/`-O` answer in the shape of RUNCTL_MOCK_SLURM_RELEASE (22.05 ... 25.11,
    default 22.05); like 22.05 to 23.11, `squeue --json` there ignores --jobs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any

from orchestrator.errors import SchedulerError

from .answers import SQUEUE_FORMAT, json_filters
from .hostlist import expand_hostlist
from .mock_core import NOT_SLURM, TERMINAL, MockSlurm, parse_sbatch_args, write_shims
from .mock_exec import ExecutingMockSlurm, run_job, srun_main
from .release_shapes import (
    DEFAULT_RELEASE,
    FULL_RELEASE,
    INFINITE,
    ModelJob,
    check_release,
    json_answer,
    text_line,
)

RELEASE_ENV = "RUNCTL_MOCK_SLURM_RELEASE"

STATE_REASON_NONE = "None"


def _iso(stamp: float) -> str:
    if not stamp:
        return "Unknown"
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%dT%H:%M:%S")


def _exit_pair(raw: int) -> str:
    return f"{(raw >> 8) & 0xFF}:{raw & 0x7F}"


def mock_release() -> str:
    """The SLURM release the mock answers as (RUNCTL_MOCK_SLURM_RELEASE)."""
    return check_release(os.environ.get(RELEASE_ENV, DEFAULT_RELEASE))


def model_job(job: dict[str, Any]) -> ModelJob:
    """A mock job as slurmctld would hold it."""
    running = bool(job["start_time"])
    return ModelJob(
        job_id=int(job["job_id"]), name=job["name"], user=os.environ.get("USER", "root"), state=job["state"],
        reason=job["reason"], raw_exit=int(job["raw_exit"]), nodes=job["nodelist"] if running else "",
        submit=int(job["submit_time"]), start=int(job["start_time"]),
        end=int(job["end_time"]) if job["state"] in TERMINAL else INFINITE if running else 0,
    )  # fmt: skip


def squeue_answer(jobs: list[dict[str, Any]], release: str, as_json: bool, command: list[str]) -> str:
    """What `squeue --json` or `squeue -h -O answers.SQUEUE_FORMAT` of `release` prints."""
    models = [model_job(j) for j in jobs]
    if as_json:
        answer = json_answer(models, release, command)
        answer["meta"]["mock"] = NOT_SLURM
        return json.dumps(answer, indent=1)
    return "".join(text_line(m, release) + "\n" for m in models)


def _format_line(job: dict[str, Any], fmt: str) -> str:
    short = {"PENDING": "PD", "RUNNING": "R", "COMPLETED": "CD", "FAILED": "F", "CANCELLED": "CA", "TIMEOUT": "TO",
             "COMPLETING": "CG", "NODE_FAIL": "NF"}  # fmt: skip
    codes = {
        "i": job["job_id"], "A": job["job_id"], "j": job["name"], "T": job["state"],
        "t": short.get(job["state"], job["state"]), "N": job["nodelist"] if job["state"] != "PENDING" else "",
        "r": job["reason"], "D": str(job["num_nodes"]), "u": os.environ.get("USER", "root"),
    }  # fmt: skip
    out, i = "", 0
    while i < len(fmt):
        if fmt[i] == "%" and i + 1 < len(fmt):
            j = i + 1
            while j < len(fmt) and (fmt[j].isdigit() or fmt[j] in ".-"):
                j += 1
            code = fmt[j] if j < len(fmt) else ""
            if code not in codes:
                raise SchedulerError(
                    f"mock-slurm squeue: format code %{code} is not emulated (have {sorted(codes)})"
                )
            out += codes[code]
            i = j + 1
        else:
            out += fmt[i]
            i += 1
    return out


def cmd_sbatch(slurm: MockSlurm, argv: list[str]) -> int:
    options = parse_sbatch_args(argv)
    script = options.get("script")
    if not script:
        print(
            "mock-slurm sbatch: error: give a batch script (stdin scripts are not emulated)", file=sys.stderr
        )
        return 1
    try:
        text = open(script).read()
    except OSError as exc:
        print(f"mock-slurm sbatch: error: Unable to open file {script}: {exc}", file=sys.stderr)
        return 1
    job_id = slurm.submit(parse_sbatch_args(argv, text), script)
    print(job_id if "parsable" in options else f"Submitted batch job {job_id}")
    return 0


def cmd_squeue(slurm: MockSlurm, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="squeue", add_help=False)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("-h", "--noheader", action="store_true")
    parser.add_argument("-o", "--format", default="%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R")
    parser.add_argument("-j", "--jobs", default=None)
    parser.add_argument("-t", "--states", default=None)
    parser.add_argument("-a", "--all", action="store_true")
    parser.add_argument("--me", action="store_true")
    parser.add_argument("-n", "--name", default=None)
    parser.add_argument("-u", "--user", default=None)  # every mock job is the caller's
    parser.add_argument("-O", "--Format", default=None)
    parser.add_argument("-V", "--version", action="store_true")
    args = parser.parse_args(argv)
    release = mock_release()
    if args.version:
        print(f"slurm {FULL_RELEASE[release]}")
        return 0
    ids = args.jobs.split(",") if args.jobs else None
    filtered = not args.json or json_filters(release)  # older releases' --json ignores filters
    jobs = slurm.observe(ids if filtered else None)
    if filtered and args.name:
        jobs = [j for j in jobs if j["name"] == args.name]
    if (
        filtered
        and (args.states is None or args.states.lower() != "all")
        and not (args.jobs and not args.json)
    ):
        jobs = [j for j in jobs if j["state"] in ("PENDING", "RUNNING", "COMPLETING")]
    if args.json or args.Format:
        if args.Format and args.Format != SQUEUE_FORMAT:
            raise SchedulerError(f"mock-slurm squeue: only -O {SQUEUE_FORMAT} is emulated")
        print(squeue_answer(jobs, release, args.json, ["squeue", *argv]), end="" if args.Format else "\n")
        return 0
    if not args.noheader:
        print("JOBID NAME STATE NODELIST(REASON)")
    for job in jobs:
        print(_format_line(job, args.format.replace("%P", "mock").replace("%M", "0:00")))
    return 0


def cmd_scontrol(slurm: MockSlurm, argv: list[str]) -> int:
    args = [a for a in argv if a not in ("-o", "--oneliner")]
    if not args:
        raise SchedulerError("mock-slurm scontrol: give a command")
    verb, rest = args[0], args[1:]
    if verb == "ping":
        print("Slurmctld(primary) at mock is UP  (" + NOT_SLURM + ")")
    elif verb == "show" and rest and rest[0] == "hostnames":
        hostlist = rest[1] if len(rest) > 1 else os.environ.get("SLURM_JOB_NODELIST", "")
        print("\n".join(expand_hostlist(hostlist)))
    elif verb == "show" and rest and rest[0] == "node":
        for name in expand_hostlist(rest[1]) if len(rest) > 1 else []:
            print(
                f"NodeName={name} Arch=x86_64 CoresPerSocket=1\n   NodeAddr=127.0.0.1 NodeHostName=localhost\n   State=IDLE Comment=mock"
            )
    elif verb == "show" and rest and rest[0] == "job":
        for job in slurm.observe(rest[1:2] if len(rest) > 1 else None):
            print(
                f"JobId={job['job_id']} JobName={job['name']} JobState={job['state']} Reason={job['reason']} "
                f"Dependency={job['dependency'] or '(null)'} ExitCode={_exit_pair(job['raw_exit'])} "
                f"NodeList={job['nodelist'] if job['state'] != 'PENDING' else '(null)'} NumNodes={job['num_nodes']} "
                f"ExcNodeList={job['exclude'] or '(null)'} StartTime={_iso(job['start_time'])} "
                f"EndTime={_iso(job['end_time'])} Command={job['script']} WorkDir={job['cwd']}"
            )
    elif verb in ("hold", "release"):
        ids = [i for arg in rest for i in arg.split(",") if i]
        slurm.set_held(ids, verb == "hold")
    elif verb == "update":
        fields = dict(a.split("=", 1) for a in rest if "=" in a)
        job_id = fields.pop("JobId", fields.pop("jobid", None))
        if job_id is None:
            raise SchedulerError("mock-slurm scontrol update: give JobId=")
        slurm.update(job_id, fields)
    else:
        raise SchedulerError(f"mock-slurm scontrol: `{' '.join(argv)}` is not emulated")
    return 0


def cmd_scancel(slurm: MockSlurm, argv: list[str]) -> int:
    signal, ids, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--signal="):
            signal = arg.split("=", 1)[1]
        elif arg in ("-s", "--signal"):
            i += 1
            signal = argv[i]
        elif arg.startswith("-"):
            pass  # --full, --batch, ...: recorded, not emulated
        else:
            ids += [x for x in arg.split(",") if x]
        i += 1
    slurm.cancel(ids, signal)
    return 0


def cmd_sacct(slurm: MockSlurm, argv: list[str]) -> int:
    """The mock keeps accounting for every job: `sacct -n -P -X -j IDS -o FIELDS`."""
    parser = argparse.ArgumentParser(prog="sacct", add_help=False)
    parser.add_argument("-j", "--jobs", default=None)
    parser.add_argument("-o", "--format", default="JobID,JobName,State,ExitCode")
    for flag in ("-n", "--noheader", "-P", "--parsable2", "-X", "--allocations"):
        parser.add_argument(flag, action="store_true")
    args = parser.parse_args(argv)
    jobs = slurm.observe(args.jobs.split(",") if args.jobs else None)
    fields = args.format.split(",")
    values = {
        "jobid": lambda j: j["job_id"], "jobidraw": lambda j: j["job_id"], "jobname": lambda j: j["name"],
        "state": lambda j: j["state"], "exitcode": lambda j: _exit_pair(j["raw_exit"]),
        "nodelist": lambda j: j["nodelist"] if j["state"] != "PENDING" else "None assigned",
        "start": lambda j: _iso(j["start_time"]), "end": lambda j: _iso(j["end_time"]),
    }  # fmt: skip
    for field in fields:
        if field.lower() not in values:
            raise SchedulerError(f"mock-slurm sacct: field {field} is not emulated (have {sorted(values)})")
    for job in jobs:
        print("|".join(str(values[f.lower()](job)) for f in fields))
    return 0


COMMANDS = {
    "sbatch": cmd_sbatch,
    "squeue": cmd_squeue,
    "scontrol": cmd_scontrol,
    "scancel": cmd_scancel,
    "sacct": cmd_sacct,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "shim-dir":
        parser = argparse.ArgumentParser(prog="python -m orchestrator.slurm.mock shim-dir")
        parser.add_argument("dir")
        parser.add_argument(
            "--state", default=None, help="mock state directory (default $RUNCTL_MOCK_SLURM_DIR)"
        )
        parser.add_argument("--execute", action="store_true", help="run batch scripts on this machine")
        args = parser.parse_args(rest)
        for path in write_shims(args.dir, args.state, execute=True if args.execute else None):
            print(path)
        print(f"{NOT_SLURM}. export PATH={os.path.abspath(args.dir)}:$PATH", file=sys.stderr)
        return 0
    if command == "srun":
        return srun_main(rest)
    if command == "run-job":
        return run_job(ExecutingMockSlurm(), rest[0])
    if command not in COMMANDS:
        print(
            f"mock-slurm: unknown command {command!r}; have {sorted(COMMANDS)} + srun, shim-dir",
            file=sys.stderr,
        )
        return 2
    slurm = ExecutingMockSlurm()
    slurm.record_command([command, *rest])
    try:
        code = COMMANDS[command](slurm, rest)
        sys.stdout.flush()
        return code
    except SchedulerError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader left early (`scontrol show hostnames ... | head -n 1` in every job script).
        # SLURM's tools die of SIGPIPE there without a word; do the same, with no traceback into
        # the job's log, and keep Python's exit-time flush from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13


if __name__ == "__main__":
    sys.exit(main())
