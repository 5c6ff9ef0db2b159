"""Every `runctl ...` command in docs/oncall.md exists and parses (subcommand and flags).

What each one does is tested elsewhere: status (tests/slurm), watch/events/kill/resume/nodes/report
(tests/controller/test_cli.py, test_operators.py, test_e2e_slurm.py)."""

from __future__ import annotations

import re
import shlex

import pytest
from fakes import REPO

from orchestrator.cli.main import build_parser

DOC = REPO / "docs" / "oncall.md"


def runbook_commands() -> list[str]:
    text = DOC.read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith("runctl "):
                commands.append(line)
    commands += [c for c in re.findall(r"`(runctl [^`]+)`", text)]
    return sorted(set(commands))


def test_runbook_has_the_essential_commands():
    verbs = {shlex.split(c)[1] for c in runbook_commands()}
    assert {"status", "watch", "events", "kill", "resume", "nodes", "report"} <= verbs


@pytest.mark.parametrize("command", runbook_commands())
def test_runbook_command_parses(command):
    parser = build_parser()
    argv = shlex.split(command.replace("RUN", "/tmp/some-run"))[1:]
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"docs/oncall.md: `{command}` does not parse (exit {exc.code})")
    assert callable(args.func)
