"""`runctl`'s help, version and shell completion, and how fast the two commands people type
first start: `runctl --help` and `runctl status` (the import path, timed as CPU time of the
command's own process, so that a loaded CI machine does not make it fail)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import __version__
from orchestrator.cli.main import build_parser, main
from orchestrator.errors import CliExit

REPO = Path(__file__).resolve().parents[2]
# Heavy modules none of these commands may import (torch for the trainer; the others are
# imported by the one command that needs them).
HEAVY = ("torch", "deepspeed", "triton", "numpy", "matplotlib", "apprise", "shtab", "requests")


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


def _cpu_seconds(code: str, env: dict) -> dict:
    """Run `code` in a fresh interpreter; its CPU time from the first import to the end, and the
    heavy modules it imported."""
    wrapped = (
        "import time, sys, json, io, contextlib\n"
        "t = time.process_time()\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        + "".join(f"    {line}\n" for line in code.splitlines())
        + f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps({'cpu': time.process_time() - t, 'heavy': heavy}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", wrapped], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_help_and_status_start_in_well_under_a_second(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "RUNCTL_SCHEDULER": "mock", "RUNCTL_MOCK_SLURM_DIR": str(tmp_path / "mock")}
    subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "submit", str(REPO / "configs" / "demo-cpu-4node.yaml"),
                    "--run-dir", str(tmp_path / "run")], env=env, check=True, capture_output=True, timeout=60)  # fmt: skip
    help_ = _cpu_seconds(
        "from orchestrator.cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass", env
    )
    status = _cpu_seconds(f"from orchestrator.cli.main import main\nmain(['status', {str(tmp_path / 'run')!r}])", env)
    print(f"CPU seconds: --help {help_['cpu']:.3f}, status {status['cpu']:.3f}")
    assert help_["heavy"] == [] and status["heavy"] == []
    assert help_["cpu"] < 0.5 and status["cpu"] < 1.0
