"""The real SLURM backend: drives `sbatch`, `squeue`, `scontrol`, `scancel` and `sacct`.

Every command's output is parsed strictly (`answers`): anything unexpected raises SchedulerError
carrying the command and its output, never a guess. Works unchanged against the mocked SLURM's
shims (`python -m orchestrator.slurm.mock shim-dir DIR` + PATH), which is how CI exercises it.

One squeue a pass, asking only for the run's jobs by id, in the form whose filters the installed
release honours: `squeue --json` applies `--jobs`/`--name` only from 24.05 on (22.05 to 23.11
print every job slurmctld knows, megabytes on a busy site), so those releases are asked in text
(`squeue -h -O`, whose filters every release honours). The release is `squeue --version`'s, asked
once per scheduler (it asks slurmctld for no jobs; it needs the config, from SLURM_CONF or, on a
configless site, from slurmctld).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence

from orchestrator.errors import SchedulerError

from .answers import (  # noqa: F401 - decode_wait_status re-exported
    JSON_FILTERS_FROM,
    SQUEUE_FORMAT,
    decode_wait_status,
    jobs_from_json,
    jobs_from_text,
    read_exit,
    read_job_state,
    read_nodes,
)
from .base import (
    JobInfo,
    JobState,
    NodeConfigUnavailable,
    NodeInfo,
    SubmitRequest,
    refused_for_nodes,
    sbatch_argv,
)
from .node_query import nodes_from_json, nodes_from_text

SIGNAL_NAME = re.compile(r"^(SIG)?[A-Z0-9]{1,8}$")
JOB_ID = re.compile(r"^\d+(_\d+)?$")
JOB_NAME = re.compile(r"^[A-Za-z0-9_.+\-]{1,200}$")
RELEASE = re.compile(r"^slurm(?:-wlm)? (\d+)\.(\d+)(?:\.\S+)?$")
# squeue asked for a single job that slurmctld has forgotten (older than MinJobAge): not an outage.
FORGOTTEN_JOB = "Invalid job id specified"
# A slurmctld that answers does so in milliseconds; a stopped or overloaded one would keep a
# controller pass waiting its whole MessageTimeout.
CONTROLLER_PING_SECONDS = 3.0


def _show(args: Sequence[str], proc: subprocess.CompletedProcess[str]) -> str:
    out = (proc.stdout or "").strip()
    err = (proc.stderr or "").strip()
    return f"`{' '.join(args)}` exited {proc.returncode}\n  stdout: {out or '(empty)'}\n  stderr: {err or '(empty)'}"


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
        self._release: tuple[int, int] | None = None  # learnt on first squeue call

    def _run(
        self, args: list[str], check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(
                args, env=env or self.env, capture_output=True, text=True, timeout=self.timeout, check=False
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
        file, so nothing to follow); None when the node did not run it or did not end it within
        `timeout`. srun needs slurmctld to create the step: a step that failed while slurmctld
        does not answer says nothing of the node, so that raises SchedulerError instead (a
        stopped slurmctld leaves srun waiting exactly as an unreachable node does)."""
        args = ["srun", "--overlap", f"--jobid={job_id}", "-w", node, "-N1", "-n1", "--quiet",
                "sh", "-c", script]  # fmt: skip
        try:
            proc = subprocess.run(args, env=self.env, capture_output=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired):
            proc = None
        if proc is not None and proc.returncode == 0:
            return proc.stdout[: 64 << 10].decode(errors="replace")
        if not self.controller_answers():
            raise SchedulerError(f"slurmctld does not answer: {node} could not be asked (job {job_id})")
        return None

    def controller_answers(self, timeout: float = CONTROLLER_PING_SECONDS) -> bool:
        """`scontrol ping` says a slurmctld is UP within `timeout` seconds."""
        try:
            proc = subprocess.run(["scontrol", "ping"], env=self.env, capture_output=True, text=True,
                                  timeout=timeout, check=False)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return False
        return proc.returncode == 0 and " is UP" in proc.stdout

    # Submission --------------------------------------------------------------------------------
    def submit(self, request: SubmitRequest) -> str:
        args = sbatch_argv(request)
        proc = self._run(args, check=False)
        if proc.returncode != 0:
            refused = refused_for_nodes(proc.stderr or "")
            raise (NodeConfigUnavailable if refused else SchedulerError)(_show(args, proc))
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
        found = self._squeue_ids(wanted)
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
        if not JOB_NAME.match(name):
            raise SchedulerError(f"not a job name we submit: {name!r} (letters, digits, _.+-)")
        return {j: info for j, info in self._squeue([f"--name={name}"]).items() if info.name == name}

    def _squeue_ids(self, wanted: list[str]) -> dict[str, JobInfo]:
        # One id: slurmctld looks up that job alone (its cost does not grow with the queue).
        # Several: squeue loads every job and keeps ours; the answer stays ours alone, but
        # slurmctld walks its whole job list (bench/slurm_foreign_jobs.py; --user does not
        # spare that walk on 22.05, measured there too).
        found = self._squeue([f"--jobs={','.join(wanted)}"])
        return {j: info for j, info in found.items() if j in wanted}

    def slurm_release(self) -> tuple[int, int]:
        """(major, minor) of the installed SLURM, from `squeue --version` (no slurmctld call)."""
        if self._release is None:
            args = ["squeue", "--version"]
            proc = self._run(args)
            match = RELEASE.match(proc.stdout.strip())
            if not match:
                raise SchedulerError(
                    f"cannot read SLURM's release from `squeue --version`:\n{_show(args, proc)}"
                )
            self._release = (int(match.group(1)), int(match.group(2)))
        return self._release

    def _squeue(self, selection: list[str]) -> dict[str, JobInfo]:
        """One squeue for the selected jobs, in every state, in the form this release filters."""
        release = self.slurm_release()
        release_text = f"{release[0]}.{release[1]:02d}"
        if release >= JSON_FILTERS_FROM:
            args = ["squeue", "--json", "--states=all", *selection]
        else:
            args = ["squeue", "--noheader", "--states=all", *selection, f"--Format={SQUEUE_FORMAT}"]
        env = dict(self.env if self.env is not None else os.environ, SLURM_TIME_FORMAT="%s")
        proc = self._run(args, check=False, env=env)
        if proc.returncode != 0:
            if FORGOTTEN_JOB in proc.stderr:
                return {}
            if not (proc.stdout.strip() or proc.stderr.strip()):
                # 24.11 with slurmctld down: ~30 s, then exit 1 and not a word. An outage.
                raise SchedulerError(
                    f"`{' '.join(args)}` exited {proc.returncode} with no output: slurmctld is not "
                    f"answering (check `scontrol ping`); no job is judged from this"
                )
            raise SchedulerError(_show(args, proc))
        if release >= JSON_FILTERS_FROM:
            infos = jobs_from_json(proc.stdout, lambda: _show(args, proc))
        else:
            infos = jobs_from_text(proc.stdout, release_text)
        return {info.job_id: info for info in infos}

    def nodes(self) -> dict[str, NodeInfo]:
        """`scontrol show node --json` where this SLURM has it, else its one-line text form."""
        args = ["scontrol", "show", "node", "--json"]
        proc = self._run(args, check=False)
        if proc.returncode == 0 and proc.stdout.lstrip().startswith("{"):
            return nodes_from_json(proc.stdout, lambda: _show(args, proc))
        args = ["scontrol", "show", "node", "-o"]
        proc = self._run(args)
        return nodes_from_text(proc.stdout)

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
            # sacct says "CANCELLED by 1000": the state is the first word.
            info_state, _ = read_job_state(state.split()[0] if state.strip() else "", "", "sacct")
            code, sig = read_exit(exit_pair, "sacct")
            out[job_id] = JobInfo(
                job_id=job_id, name=name, state=info_state, nodes=read_nodes(nodelist, "sacct"),
                exit_code=code, signal=sig,
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
    spaces (Command=...), so a new key starts only at whitespace followed by `Word=`."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    if "=" not in line:
        raise SchedulerError(
            f"cannot parse scontrol's answer as Key=Value pairs: `{' '.join(args)}` printed {text!r}"
        )
    # SLURM puts two spaces between some pairs (`Partitions=debug  BootTime=`).
    parts = re.split(r"\s+(?=[A-Za-z][A-Za-z0-9/:_]*=)", line)
    out: dict[str, str] = {}
    for part in parts:
        key, _, value = part.partition("=")
        out[key] = value
    return out
