"""The probe job: before a 384-GPU job is queued, one node of the run's partition, account and QOS
runs what the training job will run first (the site's set-up commands, the container, the
configured interpreter) and checks what the trainer needs: the interpreter starts; it imports
the trainer, torch and DeepSpeed; it sees the GPUs; the run directory is writable; the data and
the tokenizer are readable. A job never waits in the queue only to die on an import.

    report = run_probe(cfg, scheduler, scratch_parent, timeout_seconds=900)
    report.ok, report.failed, report.lines()

The job's files (script and output) go to a private folder made under `scratch_parent` (the run
directory's parent: a filesystem the nodes and this host share), removed when every check passed
and kept for reading when one did not. The program the node runs is probe_program.py, given to
the interpreter with `-c`, so it needs nothing of this project installed to report that the
project is missing. `runctl submit` runs it unless --skip-probe; `runctl check-env` runs only it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.contract import JobState
from orchestrator.contract.files import UntrustedFileError, read_untrusted_tail
from orchestrator.errors import UsageError
from orchestrator.plan.config import RunConfig
from orchestrator.plan.config.site_options import step_options

from .base import SubmitRequest
from .render import render_template, run_job_name

TEMPLATE = "probe.sbatch.j2"
PROGRAM = Path(__file__).with_name("probe_program.py")
MARK = "RUNCTL-PROBE "
TIME_LIMIT = "00:10:00"
OUTPUT_TAIL_BYTES = 256 * 1024
POLL_SECONDS = 2.0
# What a complete probe of our trainer reports, in order (another loop's imports the client and torch,
# and checks its program); a report without "done" ended early.
REQUIRED = ("setup", "interpreter", "import trainer", "import torch", "import deepspeed", "gpus",
            "run dir writable")  # fmt: skip


class ProbeError(UsageError):
    """The probe job found the nodes cannot run this training (or could not find out)."""


@dataclass(frozen=True)
class ProbeCheck:
    check: str
    ok: bool
    detail: str


@dataclass
class ProbeReport:
    job_id: str
    state: str
    checks: list[ProbeCheck] = field(default_factory=list)
    output: str = ""  # the probe job's file, kept when a check failed
    tail: list[str] = field(default_factory=list)  # its last lines without a report mark

    @property
    def complete(self) -> bool:
        return any(c.check == "done" for c in self.checks)

    @property
    def failed(self) -> list[ProbeCheck]:
        return [c for c in self.checks if not c.ok]

    @property
    def ok(self) -> bool:
        return self.complete and not self.failed

    def lines(self) -> list[str]:
        """One verdict a check, then what went wrong, in words an operator acts on."""
        out = [
            f"{'ok  ' if c.ok else 'FAIL'}  {c.check}: {c.detail}" for c in self.checks if c.check != "done"
        ]
        if not self.complete and not self.failed:
            out.append(f"FAIL  the probe job {self.job_id} ended ({self.state}) before its checks ran")
        if not self.ok and self.tail:
            out.append(f"the last lines of its output ({self.output}):")
            out += [f"    {line}" for line in self.tail]
        return out


def probe_argv(cfg: RunConfig, write_dir: Path) -> list[str]:
    argv = [cfg.cluster.python, "-c", PROGRAM.read_text(), "--accelerator", cfg.cluster.accelerator,
            "--gpus", str(cfg.cluster.gpus_per_node), "--write-dir", str(write_dir)]  # fmt: skip
    for dataset in cfg.data.datasets:
        argv += ["--data", dataset.path]
    command = cfg.cluster.command
    if command is not None:  # another loop: the client and torch must import, its program must be there
        argv += ["--import", "orchestrator.contract.client", "--import", "torch", "--program", command[0]]
    return [*argv, "--tokenizer", cfg.data.tokenizer]


def render_probe(cfg: RunConfig, job_name: str, output: Path, write_dir: Path) -> str:
    c = cfg.cluster
    return render_template(
        TEMPLATE,
        job_name=job_name,
        gpus_per_node=c.gpus_per_node if c.accelerator == "cuda" else 0,
        cpus_per_task=c.cpus_per_task,
        time_limit=TIME_LIMIT,
        partition=c.partition,
        account=c.account,
        qos=c.qos,
        extra_sbatch=sorted(c.extra_sbatch.items()),
        output=str(output),
        env=sorted(c.env.items()),
        setup=[list(words) for words in c.setup],
        srun_options=step_options(c.srun_args, cfg.container),
        argv=probe_argv(cfg, write_dir),
        python=c.python,
    )


def parse_report(text: str) -> tuple[list[ProbeCheck], list[str]]:
    """The checks a probe job printed, and its other last lines (srun's and Python's own)."""
    checks, other = [], []
    for line in text.splitlines():
        at = line.find(MARK)
        if at < 0:
            if line.strip():
                other.append(line.rstrip()[:300])
            continue
        try:
            data = json.loads(line[at + len(MARK) :])
            checks.append(
                ProbeCheck(str(data["check"]), data["ok"] is True, str(data.get("detail", ""))[:500])
            )
        except (ValueError, KeyError, TypeError):
            other.append(line.rstrip()[:300])
    return checks, other[-12:]


def run_probe(
    cfg: RunConfig,
    scheduler,
    scratch_parent: Path,
    *,
    timeout_seconds: float = 900.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = lambda _message: None,
) -> ProbeReport:
    """Submit the probe job, wait for its end (at most `timeout_seconds`, queue time included),
    read its report. Raises ProbeError when it cannot run or does not end in time."""
    scratch_parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".runctl-probe-", dir=scratch_parent))
    output = scratch / "probe.out"
    script = scratch / "probe.sbatch"
    name = f"{run_job_name(cfg.name, scratch_parent)}-probe"
    script.write_text(render_probe(cfg, name, output, scratch))
    job_id = scheduler.submit(SubmitRequest(script=script, job_name=name))
    say(f"probe job {job_id} submitted: does {cfg.cluster.python} run the trainer on a node?")
    deadline = clock() + timeout_seconds
    state = JobState.PENDING.value
    while True:
        info = scheduler.jobs([job_id]).get(job_id)
        state = info.state.value if info is not None else JobState.UNKNOWN.value
        # UNKNOWN: gone from squeue without accounting to ask; its output says how it ended.
        if info is None or info.state.is_terminal or info.state is JobState.UNKNOWN:
            break
        if clock() > deadline:
            scheduler.cancel([job_id])
            raise ProbeError(
                f"the probe job {job_id} did not end within {timeout_seconds:.0f} s (state {state}); it was "
                "cancelled and nothing was submitted. Raise --probe-timeout, or --skip-probe to submit unchecked"
            )
        sleep(POLL_SECONDS)
    try:
        text = read_untrusted_tail(output, OUTPUT_TAIL_BYTES)[0].decode("utf-8", errors="replace")
    except (FileNotFoundError, UntrustedFileError) as exc:
        text = f"(no output: {exc})"
    checks, tail = parse_report(text)
    report = ProbeReport(job_id=job_id, state=state, checks=checks, output=str(output), tail=tail)
    if report.ok:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def require_ok(report: ProbeReport) -> None:
    if not report.ok:
        raise ProbeError(
            f"the probe job {report.job_id} says the nodes cannot run this training; nothing was submitted:\n"
            + "\n".join(f"  {line}" for line in report.lines())
            + "\nFix it and submit again (--skip-probe submits unchecked)"
        )
