"""`runctl logs RUN_DIR (--rank N | --all | --errors) [--job ID] [--follow]`: a job's output by rank.

--rank N: one rank's lines, without the label; --all: every rank's lines, interleaved as written,
each with its label; --errors: the first failing rank's traceback (contract/rank_output.py, the
reader the controller uses for its failure events). A rank outside the run's world size is refused.

Every rank of a job writes into the one job output, jobs/slurm-<job_id>.out (the sbatch script's
--output). srun's --label puts the task number before each line, right-aligned to the width of
the largest (` 7: loss 2.31` among 16 tasks), so one rank's lines are the lines with its label.
Lines without a label (the batch script's own, srun's errors) belong to no rank and are left out.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from orchestrator.contract import RunPaths
from orchestrator.contract.rank_output import labelled_lines, rank_lines, read_rank_error
from orchestrator.contract.textsafe import for_terminal
from orchestrator.errors import EXIT_OK, UsageError

FOLLOW_POLL_SECONDS = 1.0


def register(subparsers: argparse._SubParsersAction) -> None:
    logs = subparsers.add_parser(
        "logs",
        help="a job's output by rank (srun --label): one rank, all, or the first error",
        description="Print the lines of one rank (srun task number) from a job's output, "
        "jobs/slurm-<job_id>.out, without the label. The job is the run's newest unless --job is "
        "given. --follow keeps printing new lines, and moves on to the next job of the run when one "
        "starts (a restart or the next job of a chain), until Ctrl-C.",
    )
    logs.add_argument("run_dir", help="run directory")
    which = logs.add_mutually_exclusive_group(required=True)
    which.add_argument("--rank", type=int, metavar="N", help="the rank (srun task number), without its label")
    which.add_argument(
        "--all", action="store_true", help="every rank's lines, interleaved, with their labels"
    )
    which.add_argument(
        "--errors",
        action="store_true",
        help="the first failing rank's error and traceback (not with --follow)",
    )
    logs.add_argument("--job", metavar="ID", help="the job (default: the newest job of the run)")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until Ctrl-C")
    logs.set_defaults(func=run_logs)


def job_outputs(jobs_dir: Path) -> dict[str, Path]:
    """job id -> its output file, for every slurm-<id>.out in jobs/."""
    found = {}
    for path in jobs_dir.glob("slurm-*.out"):
        job = path.name[len("slurm-") : -len(".out")]
        if job.isdigit():
            found[job] = path
    return found


def newest(outputs: dict[str, Path]) -> str | None:
    return max(outputs, key=int) if outputs else None


def run_logs(args: argparse.Namespace) -> int:
    paths = RunPaths.of(args.run_dir)
    if not paths.config.exists():
        raise UsageError(f"{paths.root} is not a run directory (no run.yaml)")
    if args.rank is not None:
        _check_rank(args.rank, paths)
    if args.errors and args.follow:
        raise UsageError("--errors reads a job's output once: leave out --follow")
    outputs = job_outputs(paths.jobs)
    job = args.job or newest(outputs)
    if job is None:
        if not args.follow:
            raise UsageError(
                f"no job output in {paths.jobs} yet: has a job of this run started? `runctl status {paths.root}`"
            )
    elif job not in outputs and not args.follow:
        have = ", ".join(sorted(outputs, key=int)) or "none"
        raise UsageError(f"--job {job}: no output {paths.jobs}/slurm-{job}.out (jobs with output: {have})")
    if args.errors:
        return _print_error(paths.jobs / f"slurm-{job}.out")
    follower = _Follower(paths.jobs, job, args.rank, pinned=bool(args.job))
    lines = follower.read()
    for line in lines:
        print(for_terminal(line))
    if not lines and not args.follow:
        which = f"labelled {args.rank}:" if args.rank is not None else "with a rank's label"
        print(
            f"no lines {which} in {paths.jobs}/slurm-{job}.out (lines carry their rank once "
            "the job runs srun --label; ranks count from 0)"
        )
    if not args.follow:
        return EXIT_OK
    try:
        while True:
            time.sleep(FOLLOW_POLL_SECONDS)
            for line in follower.read():
                print(for_terminal(line), flush=True)
    except KeyboardInterrupt:
        return EXIT_OK


def _check_rank(rank: int, paths) -> None:
    """A rank the run has: from 0 to its world size - 1 (run.yaml's layout)."""
    from orchestrator.operate.runs import load_run_config  # noqa: PLC0415 - lazy: +41 ms on every runctl start

    world = load_run_config(paths.root).world_size
    if not 0 <= rank < world:
        raise UsageError(f"--rank {rank}: the run has {world} ranks, 0 to {world - 1}")


def _print_error(output: Path) -> int:
    """The first failing rank's error line and traceback, made inert by the reader."""

    error = read_rank_error(output, None)
    if error is None:
        print(f"no rank printed a traceback in the tail of {output}")
        return EXIT_OK
    print(error.describe())
    for line in error.lines:
        print(f"  {line}")
    return EXIT_OK


class _Follower:
    """Reads one job's output incrementally, line by line (a 100-hour job of 384 ranks writes
    gigabytes: never the whole file at once); unless pinned to a job, moves on to a newer job's
    output when one appears, with a line that says so."""

    def __init__(self, jobs_dir: Path, job: str | None, rank: int | None, pinned: bool):
        """`rank` None: every rank's lines, each with its label."""
        self.jobs_dir, self.job, self.rank, self.pinned = jobs_dir, job, rank, pinned
        self.offset = 0

    def read(self) -> list[str]:
        out: list[str] = []
        if not self.pinned:
            latest = newest(job_outputs(self.jobs_dir))
            if latest is not None and latest != self.job:
                if self.job is not None:
                    out += self._new_lines(final=True)
                    who = f"its rank {self.rank} follows" if self.rank is not None else "its ranks follow"
                    out.append(f"--- runctl logs: job {latest} started; {who}")
                self.job, self.offset = latest, 0
        return out + self._new_lines()

    def _new_lines(self, final: bool = False) -> list[str]:
        """The rank's complete lines written since the last call (a line still being written waits
        for its newline, unless the job has been left for a newer one)."""
        if self.job is None:
            return []
        lines = []
        try:
            with open(self.jobs_dir / f"slurm-{self.job}.out", "rb") as handle:
                handle.seek(self.offset)
                for raw in handle:
                    if not raw.endswith(b"\n") and not final:
                        break
                    self.offset += len(raw)
                    text = raw.decode("utf-8", errors="replace")
                    if self.rank is None:
                        lines += [f"{rank}: {line}" for rank, line in labelled_lines(text)]
                    else:
                        lines += rank_lines(text, self.rank)
        except FileNotFoundError:
            return []
        return lines
