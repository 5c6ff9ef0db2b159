"""The real SLURM backend: drives `sbatch`, `squeue --json`, `scontrol`, `scancel` and `sacct`.

Every command's output is parsed strictly: anything unexpected raises SchedulerError carrying the
command and its full output, never a guess. Works unchanged against the mocked SLURM's shims
(`python -m orchestrator.slurm.mock shim-dir DIR` + PATH), which is how CI exercises it.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence

from orchestrator.errors import SchedulerError

from .base import JobInfo, JobState, NodeInfo, SubmitRequest, job_state_from_slurm, sbatch_argv
from .hostlist import expand_hostlist
from .node_query import nodes_from_json, nodes_from_text, squeue_records

# scontrol hold reasons that mean "held", whatever the job state says.
HELD_REASONS = {"JobHeldUser", "JobHeldAdmin"}
SIGNAL_NAME = re.compile(r"^(SIG)?[A-Z0-9]{1,8}$")
JOB_ID = re.compile(r"^\d+(_\d+)?$")


def _show(args: Sequence[str], proc: subprocess.CompletedProcess[str]) -> str:
    out = (proc.stdout or "").strip()
    err = (proc.stderr or "").strip()
    return f"`{' '.join(args)}` exited {proc.returncode}\n  stdout: {out or '(empty)'}\n  stderr: {err or '(empty)'}"


def decode_wait_status(raw: int) -> tuple[int | None, int | None]:
    """squeue --json gives the batch script's raw wait status: exit code in the high byte, the
    terminating signal in the low 7 bits. Returns (exit_code, signal)."""
    sig = raw & 0x7F
    if sig:
        return 128 + sig, sig
    return (raw >> 8) & 0xFF, None


class SlurmScheduler:
    """`Scheduler` over SLURM's command-line tools.

    env: the environment for the commands (e.g. with SLURM_CONF of the local cluster); default
    os.environ. timeout: seconds per command.
    """

    name = "slurm"

    def __init__(self, env: dict[str, str] | None = None, timeout: float = 60.0):
        self.env = dict(env) if env is not None else None
        self.timeout = timeout
        self._accounting: bool | None = None  # learnt on first sacct call

    def _run(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(
                args, env=self.env, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except FileNotFoundError:
            raise SchedulerError(
                f"`{args[0]}` is not on PATH: load SLURM (`module load slurm`, or put its bin directory "
                f"on PATH; the local cluster: `runctl cluster up` and `eval $(runctl cluster env)`), or set "
                f"RUNCTL_SCHEDULER=mock for a dry run against the mocked SLURM"
            ) from None
        except subprocess.TimeoutExpired:
            raise SchedulerError(
                f"`{' '.join(args)}` did not answer within {self.timeout:.0f} s: is slurmctld up?"
            ) from None
        if check and proc.returncode != 0:
            raise SchedulerError(_show(args, proc))
        return proc

    def probe_node(self, job_id: str, node: str, script: str, timeout: float) -> str | None:
        """Run `script` (sh) as one step of job `job_id` on `node`, beside its running steps
        (--overlap, no resources of its own). Its output, at most 64 KiB, read from a pipe (no
        file, so nothing to follow); None when it did not run or did not end within `timeout`."""
        args = ["srun", "--overlap", f"--jobid={job_id}", "-w", node, "-N1", "-n1", "--quiet",
                "sh", "-c", script]  # fmt: skip
        try:
            proc = subprocess.run(args, env=self.env, capture_output=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if proc.returncode != 0:
            return None
        return proc.stdout[: 64 << 10].decode(errors="replace")

    # Submission --------------------------------------------------------------------------------
    def submit(self, request: SubmitRequest) -> str:
        args = sbatch_argv(request)
        proc = self._run(args)
        # --parsable prints "<id>" or "<id>;<cluster>".
        first = proc.stdout.strip().split(";")[0]
        if not JOB_ID.match(first):
            raise SchedulerError(f"cannot read a job id from sbatch's answer:\n{_show(args, proc)}")
        return first

    # Queries -----------------------------------------------------------------------------------
    def jobs(self, job_ids: list[str]) -> dict[str, JobInfo]:
        wanted = [str(j) for j in job_ids]
        if not wanted:
            return {}
        found = self._squeue_json(wanted)
        missing = [j for j in wanted if j not in found]
        if missing:
            found.update(self._sacct(missing))
        for job_id in wanted:
            found.setdefault(
                job_id,
                JobInfo(
                    job_id=job_id, name="", state=JobState.UNKNOWN, reason="not in squeue, no accounting"
                ),
            )
        return {j: found[j] for j in wanted}

    def jobs_by_name(self, name: str) -> dict[str, JobInfo]:
        """Every job slurmctld still knows under this job name (the controller uses it to adopt a
        job whose submission it did not see finish)."""
        return {j: info for j, info in self._squeue_json(None).items() if info.name == name}

    def _squeue_json(self, wanted: list[str] | None) -> dict[str, JobInfo]:
        # `squeue --json` in 22.05 ignores filters and lists every job slurmctld still knows
        # (finished ones for MinJobAge seconds): filter here.
        args = ["squeue", "--json"]
        proc = self._run(args)
        out: dict[str, JobInfo] = {}
        for record in squeue_records(proc.stdout, lambda: _show(args, proc)):
            try:
                info = self._job_from_json(record)
            except (KeyError, TypeError, ValueError) as exc:
                raise SchedulerError(
                    f"unexpected job record in squeue's JSON ({exc}):\n{json.dumps(record)[:2000]}"
                ) from None
            if wanted is None or info.job_id in wanted:
                out[info.job_id] = info
        return out

    def nodes(self) -> dict[str, NodeInfo]:
        """`scontrol show node --json` where this SLURM has it, else its one-line text form."""
        args = ["scontrol", "show", "node", "--json"]
        proc = self._run(args, check=False)
        if proc.returncode == 0 and proc.stdout.lstrip().startswith("{"):
            return nodes_from_json(proc.stdout, lambda: _show(args, proc))
        args = ["scontrol", "show", "node", "-o"]
        proc = self._run(args)
        return nodes_from_text(proc.stdout)

    @staticmethod
    def _job_from_json(record: dict) -> JobInfo:
        job_id = str(record["job_id"])
        state = job_state_from_slurm(str(record["job_state"]))
        reason = str(record.get("state_reason") or "")
        held = reason in HELD_REASONS
        if held and state == JobState.PENDING:
            state = JobState.HELD
        exit_code = signal = None
        if state.is_terminal and record.get("exit_code") is not None:
            exit_code, signal = decode_wait_status(int(record["exit_code"]))
        nodes = expand_hostlist(record["nodes"]) if record.get("nodes") else []

        def stamp(key: str) -> float | None:
            value = record.get(key)
            return float(value) if value else None

        end = stamp("end_time") if state.is_terminal else None
        # SLURM stamps start_time = end_time on a job cancelled while pending: no nodes, never started.
        start = stamp("start_time") if nodes else None
        return JobInfo(
            job_id=job_id, name=str(record.get("name", "")), state=state, nodes=nodes, exit_code=exit_code,
            signal=signal, reason="" if reason == "None" else reason, start_time=start,
            end_time=end, held=held, user=str(record.get("user_name") or ""), submit_time=stamp("submit_time"),
        )  # fmt: skip

    def _sacct(self, job_ids: list[str]) -> dict[str, JobInfo]:
        """End states of jobs squeue forgot; {} when accounting is not configured."""
        if self._accounting is False:
            return {}
        args = [
            "sacct",
            "-n",
            "-P",
            "-X",
            "-j",
            ",".join(job_ids),
            "-o",
            "JobIDRaw,JobName,State,ExitCode,NodeList",
        ]
        proc = self._run(args, check=False)
        if proc.returncode != 0:
            if "accounting storage is disabled" in (proc.stderr + proc.stdout).lower():
                self._accounting = False
                return {}
            raise SchedulerError(_show(args, proc))
        self._accounting = True
        out: dict[str, JobInfo] = {}
        for line in proc.stdout.splitlines():
            if not line.strip():
                continue
            fields = line.split("|")
            if len(fields) != 5 or ":" not in fields[3]:
                raise SchedulerError(f"cannot parse sacct line {line!r}:\n{_show(args, proc)}")
            job_id, name, state, exit_pair, nodelist = fields
            code, sig = exit_pair.split(":", 1)
            info_state = job_state_from_slurm(state)
            out[job_id] = JobInfo(
                job_id=job_id, name=name, state=info_state,
                nodes=expand_hostlist(nodelist) if nodelist and nodelist != "None assigned" else [],
                exit_code=(128 + int(sig)) if int(sig) else int(code), signal=int(sig) or None,
            )  # fmt: skip
        return out

    def show_job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o ID` as a dict (JobState, Reason, NodeList, ExitCode, ...)."""
        args = ["scontrol", "show", "job", "-o", str(job_id)]
        return parse_scontrol_record(self._run(args).stdout, args)

    # Actions -----------------------------------------------------------------------------------
    def cancel(self, job_ids: list[str], signal: str | None = None) -> None:
        """scancel. With a signal, the job steps (every srun task, i.e. every rank) get it and the
        job goes on; without, the jobs end (CANCELLED). Jobs already gone are not an error."""
        if not job_ids:
            return
        args = ["scancel"]
        if signal:
            if not SIGNAL_NAME.match(signal):
                raise SchedulerError(f"not a signal name: {signal!r} (e.g. USR1, TERM)")
            args.append(f"--signal={signal}")
        args += [str(j) for j in job_ids]
        proc = self._run(args, check=False)
        if (
            proc.returncode != 0
            and "already completing or completed" not in proc.stderr
            and "Invalid job id" not in proc.stderr
        ):
            raise SchedulerError(_show(args, proc))

    def hold(self, job_ids: list[str]) -> None:
        if job_ids:
            self._run(["scontrol", "hold", ",".join(map(str, job_ids))])

    def release(self, job_ids: list[str]) -> None:
        if job_ids:
            self._run(["scontrol", "release", ",".join(map(str, job_ids))])

    def update_exclude(self, job_ids: list[str], exclude: list[str]) -> None:
        for job_id in job_ids:
            self._run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(exclude)}"])


def parse_scontrol_record(text: str, args: Sequence[str] = ("scontrol",)) -> dict[str, str]:
    """One `scontrol show ... -o` line (Key=Value Key=Value ...) to a dict. Values may contain
    spaces (Command=...), so a new key starts only at ` Word=`."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    if "=" not in line:
        raise SchedulerError(
            f"cannot parse scontrol's answer as Key=Value pairs: `{' '.join(args)}` printed {text!r}"
        )
    parts = re.split(r" (?=[A-Za-z][A-Za-z0-9/:_]*=)", line)
    out: dict[str, str] = {}
    for part in parts:
        key, _, value = part.partition("=")
        out[key] = value
    return out
