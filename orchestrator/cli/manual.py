"""The examples and exit codes that every `runctl COMMAND --help` ends with.

Exit codes come from the one table, orchestrator.errors.CliExit; each command lists the ones it
can end with (every command may also end with 130 on Ctrl-C). `build_parser` (cli/main.py)
attaches them to each subcommand; tests/unit/test_cli_help.py checks that every subcommand has a
description, examples and exit codes.
"""

from __future__ import annotations

import argparse
import textwrap

from orchestrator.errors import CliExit, describe_exit_codes

OK, FAIL, USAGE, FIT, SCHED, PERM, BUSY = (
    CliExit.OK, CliExit.FAILURE, CliExit.USAGE, CliExit.DOES_NOT_FIT, CliExit.SCHEDULER, CliExit.PERMISSION,
    CliExit.BUSY,
)  # fmt: skip
AUX = (OK, FAIL, USAGE, SCHED)  # the auxiliary jobs: preprocess, convert, export-hf, eval

# command -> (exit codes, examples)
MANUAL: dict[str, tuple[tuple[CliExit, ...], list[str]]] = {
    "plan": (
        (OK, USAGE, FIT),
        [
            "runctl plan configs/bloom-176b.yaml",
            "runctl plan configs/bloom-176b.yaml --tflops 120 --gpu-mtbf-hours 30000 --save-seconds 600",
            "runctl plan configs/bloom-176b.yaml --json | jq .expected_goodput",
        ],
    ),
    "submit": (
        (OK, USAGE, FIT, SCHED),
        [
            "runctl submit configs/bloom-176b.yaml --run-dir /gpfs/runs/tr11 --chain 5 --dry-run",
            "runctl submit configs/bloom-176b.yaml --run-dir /gpfs/runs/tr11 --chain 5",
            "RUNCTL_SCHEDULER=mock runctl submit configs/demo-cpu-4node.yaml --run-dir runs/demo",
        ],
    ),
    "check-env": (
        (OK, USAGE, SCHED),
        [
            "runctl check-env configs/bloom-176b.yaml --run-dir /gpfs/runs/tr11",
            "runctl check-env configs/bloom-176b.yaml --json | jq '.checks[] | select(.ok == false)'",
        ],
    ),
    "status": (
        (OK, USAGE),  # a scheduler that cannot be asked is a warning on the screen
        [
            "runctl status /gpfs/runs/tr11",
            "runctl status /gpfs/runs/tr11 --follow",
            "runctl status /gpfs/runs/tr11 --json",
        ],
    ),
    "cancel": ((OK, USAGE, SCHED), ["runctl cancel /gpfs/runs/tr11"]),
    "ls": ((OK, USAGE), ["runctl ls /gpfs/runs", "runctl ls /gpfs/runs --json"]),
    "logs": (
        (OK, USAGE),
        ["runctl logs /gpfs/runs/tr11 --rank 17", "runctl logs /gpfs/runs/tr11 --rank 0 --job 4207 --follow"],
    ),
    "cluster": (
        (OK, FAIL, USAGE),
        ["runctl cluster up --nodes 4", "eval $(runctl cluster env)", "runctl cluster down"],
    ),
    "watch": (
        (OK, USAGE, PERM, BUSY),
        ["runctl watch /gpfs/runs/tr11 --detach", "runctl watch /gpfs/runs/tr11 --once --json"],
    ),
    "events": (
        (OK, USAGE),
        [
            "runctl events /gpfs/runs/tr11 --since 2h --type failure --type restart",
            "runctl events /gpfs/runs/tr11 --follow",
            "runctl events /gpfs/runs/tr11 --audit",
        ],
    ),
    "kill": (
        (OK, USAGE, PERM),
        [
            'runctl kill /gpfs/runs/tr11 --reason "loss spike at step 12000"',
            'runctl kill /gpfs/runs/tr11 --now --reason "bad node"',
        ],
    ),
    "resume": ((OK, USAGE, PERM), ['runctl resume /gpfs/runs/tr11 --reason "spike understood"']),
    "health": (
        (OK, USAGE, PERM),
        ["runctl health /gpfs/runs/tr11", "runctl health /gpfs/runs/tr11 --png /tmp/tr11.png --around 200"],
    ),
    "rollback": (
        (OK, USAGE, PERM),
        [
            'runctl rollback /gpfs/runs/tr11 --to-step 11800 --skip-samples 23000000:23400000 --reason "spike at 12000"',
            "runctl rollback /gpfs/runs/tr11 --to-step 11800 --skip-samples 23000000:23400000 --lr-scale 0.5 "
            '--for-steps 500 --reason "second spike"',
        ],
    ),
    "sdc-check": (
        (OK, FAIL, USAGE, PERM, SCHED),
        [
            "runctl sdc-check /gpfs/runs/tr11 --step 11800 --steps 20",
            "runctl sdc-check runs/demo --step 8 --local",
        ],
    ),
    "nodes": (
        (OK, USAGE, PERM),
        [
            "runctl nodes /gpfs/runs/tr11",
            'runctl nodes /gpfs/runs/tr11 --clear node17 --reason "DIMM replaced"',
        ],
    ),
    "report": ((OK, USAGE), ["runctl report /gpfs/runs/tr11", "runctl report /gpfs/runs/tr11 --json"]),
    "doctor": (
        (OK, FAIL, USAGE),
        [
            "runctl doctor /gpfs/runs/tr11 --quiet",
            "*/5 * * * * runctl doctor /gpfs/runs/tr11 --quiet --restart-controller",
        ],
    ),
    "metrics": (
        (OK, USAGE),
        [
            "runctl metrics /gpfs/runs/tr11 --listen 127.0.0.1:9464",
            "runctl metrics /gpfs/runs/tr11 --textfile /var/lib/node_exporter/tr11.prom",
        ],
    ),
    "preprocess": (
        AUX,
        [
            "runctl preprocess /gpfs/runs/tr11 --input data.jsonl --output-prefix /gpfs/data/oscar_text_document"
        ],
    ),
    "convert": (AUX, ["runctl convert /gpfs/runs/tr11 --step 12000", "runctl convert runs/demo --local"]),
    "export-hf": (
        AUX,
        ["runctl export-hf /gpfs/runs/tr11 --out /gpfs/hf/tr11-step12000 --vocab-size 250680"],
    ),
    "eval": (AUX, ["runctl eval /gpfs/runs/tr11 --step 12000", "runctl eval runs/demo --local --json"]),
    "completion": (
        (OK, USAGE),
        [
            "runctl completion bash > /etc/bash_completion.d/runctl",
            "runctl completion zsh > ~/.zfunc/_runctl",
        ],
    ),
}


def epilog(command: str) -> str:
    """The text after the options in `runctl COMMAND --help`."""
    codes, examples = MANUAL[command]
    lines = ["examples:", *(f"  {e}" for e in examples), "", "exit codes:"]
    return "\n".join(lines + describe_exit_codes((*codes, CliExit.INTERRUPTED)))


class HelpFormatter(argparse.HelpFormatter):
    """Wraps prose (lines that start with a letter) and keeps indented lines (examples, codes) as
    written: a wrapped example could not be copied into a shell."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        prose: list[str] = []

        def flush() -> None:
            if prose:
                out.extend(
                    textwrap.wrap(" ".join(prose), width, initial_indent=indent, subsequent_indent=indent)
                )
                prose.clear()

        for line in text.splitlines():
            if line and not line[0].isspace():
                prose.append(line.strip())
            else:
                flush()
                out.append(indent + line)
        flush()
        return "\n".join(out)


def attach(subparsers: argparse._SubParsersAction) -> None:
    """Give every registered subcommand its epilog and the formatter that keeps it readable."""
    for name, parser in subparsers.choices.items():
        parser.epilog = epilog(name)
        parser.formatter_class = HelpFormatter
