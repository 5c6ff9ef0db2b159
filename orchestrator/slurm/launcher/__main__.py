"""`python -m orchestrator.slurm.launcher`: every job script's program (see the package docstring).

    python -m orchestrator.slurm.launcher --run-dir R [--python P] --nodes N --tasks-per-node G --cpus-per-task C
        --srun-wait W --decision-seconds D [--health --health-seconds H] [--no-label]
        [--srun-option=--OPTION[=VALUE] ...] -- <trainer command>

Exit code: the trainer's (0 finished, 17 killed, 18 time budget, 19 config error, else a failure;
srun's report decides which task's code it is: contract.job_end), or 20 when fewer than N nodes
passed the health check.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from orchestrator.contract import ExitCode

from .launcher import JobPlan, Launcher, LauncherError, log
from .srun_lines import Layout


def parse_args(argv: list[str]) -> JobPlan:
    if "--" not in argv:
        raise SystemExit("orchestrator.slurm.launcher: the trainer command follows `--`")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.slurm.launcher", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--run-dir", required=True)
    parser.add_argument(
        "--python",
        default="",
        help="the nodes' interpreter with this package (default: the command's first word)",
    )
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--tasks-per-node", type=int, required=True)
    parser.add_argument("--cpus-per-task", type=int, required=True)
    parser.add_argument("--srun-wait", type=int, default=60)
    parser.add_argument("--decision-seconds", type=float, default=0.0, help="0: no spares, one launch")
    parser.add_argument("--health", action="store_true")
    parser.add_argument("--health-seconds", type=float, default=300.0)
    parser.add_argument("--no-label", action="store_true", help="no srun --label on the ranks' output")
    parser.add_argument(
        "--srun-option", action="append", default=[], help="added to every srun step (container, site)"
    )
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    if not command:
        raise SystemExit("orchestrator.slurm.launcher: no trainer command after `--`")
    bad = [word for word in args.srun_option if not word.startswith("--")]
    if bad:
        raise SystemExit(f"orchestrator.slurm.launcher: --srun-option takes a long srun option, got {bad}")
    layout = Layout(
        args.nodes, args.tasks_per_node, args.cpus_per_task, args.srun_wait, label=not args.no_label,
        site_options=tuple(args.srun_option),
    )  # fmt: skip
    return JobPlan(
        Path(args.run_dir),
        layout,
        command,
        args.decision_seconds,
        args.health,
        args.health_seconds,
        args.python,
    )


def main(argv: list[str] | None = None) -> int:
    # Before anything is created: nothing the job writes is group- or world-writable, whatever
    # the submitting user's umask (Debian's default 002 makes files group-writable).
    os.umask(0o022)
    plan = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return Launcher(plan).run()
    except LauncherError as exc:
        log(f"cannot run the job: {exc}")
        return int(ExitCode.FAILED)


if __name__ == "__main__":
    sys.exit(main())
