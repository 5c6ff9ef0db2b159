"""`runctl`'s help, version and shell completion, and what keeps the two commands people type first
(`runctl --help` and `runctl status`) fast: they import no heavy module. Their CPU time is
bench/cli_startup.py's figure."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import cli_startup
from orchestrator import __version__
from orchestrator.cli.main import build_parser, main
from orchestrator.errors import CliExit

REPO = Path(__file__).resolve().parents[2]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_subcommand_has_a_description_examples_and_its_exit_codes():
    commands = subcommands()
    assert {"plan", "submit", "status", "ls", "logs", "events", "kill", "resume", "completion"} <= set(commands)
    for name, parser in commands.items():
        text = parser.format_help()
        assert parser.description and len(parser.description) > 40, f"`runctl {name}` has no description"
        examples = text[text.index("examples:") :]
        assert f"  runctl {name} " in examples or f"runctl {name} " in examples, f"`runctl {name}`: no example"
        codes = text[text.index("exit codes:") :].splitlines()[1:]
        listed = [int(line.split()[0]) for line in codes if line.strip()]
        assert 0 in listed and 130 in listed, f"`runctl {name}`: exit codes {listed}"
        for code in listed:  # each from the one table, with its meaning
            assert f"{code:<3} {CliExit(code).meaning}" in text


def test_examples_use_only_options_the_command_has():
    """An example that the parser refuses is worse than none."""
    runctl = build_parser()
    for name, parser in subcommands().items():
        text = parser.format_help()
        for line in text[text.index("examples:") : text.index("exit codes:")].splitlines()[1:]:
            words = shlex.split(line)
            if "runctl" not in words:
                continue  # e.g. eval $(runctl cluster env)
            argv = words[words.index("runctl") + 1 :]
            for end in ("|", ">"):
                argv = argv[: argv.index(end)] if end in argv else argv
            try:
                runctl.parse_args(argv)
            except SystemExit as exc:
                raise AssertionError(f"`runctl {name}` example does not parse: {line.strip()}") from exc


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"runctl {__version__} (bloomctl)"


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_are_generated_from_the_parser(shell, capsys, tmp_path):
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    for command in ("submit", "events", "logs", "--skip-host-checks", "--follow"):
        assert command in script, f"{shell} completion lacks {command}"
    if shell == "bash":
        path = tmp_path / "runctl.bash"
        path.write_text(script)
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    else:
        assert script.startswith("#compdef runctl")
        if shutil.which("zsh"):
            path = tmp_path / "_runctl"
            path.write_text(script)
            assert subprocess.run(["zsh", "-n", str(path)], capture_output=True).returncode == 0


def test_help_and_status_import_no_heavy_module(tmp_path):
    """What keeps them fast on any machine: neither imports torch, numpy or another heavy module.
    How fast they are (CPU seconds against the 0.5 s and 1 s targets) depends on the machine, so it
    is bench/cli_startup.py's figure, not an assertion here."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RUNCTL_SCHEDULER": "mock", "RUNCTL_MOCK_SLURM_DIR": str(tmp_path / "mock")}
    commands = cli_startup.commands(cli_startup.submitted_run(tmp_path, env))
    results = {name: cli_startup.timed_command(code, env) for name, code in commands.items()}
    print("CPU seconds:", {name: round(result["cpu"], 3) for name, result in results.items()})
    assert {name: result["heavy"] for name, result in results.items()} == {"help": [], "status": []}
