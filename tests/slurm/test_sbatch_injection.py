"""A config must never inject shell into the job script.

Every hostile value is either refused with a ConfigError that names it, or rendered inert: the
export lines of a rendered script are really run in bash, and a canary file proves that no
command ran.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.plan.config import ConfigError, load_config, parse_config
from orchestrator.slurm.render import render_sbatch

REPO = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())


def hostile_values(canary: Path) -> list[str]:
    return [
        f"x; touch {canary}",
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"x\ntouch {canary}",
        f"x' ; touch {canary} ; echo '",
        f'x" ; touch {canary} ; echo "',
        f"x && touch {canary}",
        f"x | touch {canary}",
        f"${{IFS}}$(touch {canary})",
    ]


def with_value(path: tuple[str, ...], value: object) -> dict:
    data = copy.deepcopy(BASE)
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return data


SBATCH_FIELDS = [("name",), ("cluster", "partition"), ("cluster", "account"), ("cluster", "qos"),
                 ("cluster", "time_limit"), ("cluster", "python"), ("cluster", "extra_sbatch", "constraint")]  # fmt: skip


@pytest.mark.parametrize("field", SBATCH_FIELDS, ids=[".".join(f) for f in SBATCH_FIELDS])
def test_hostile_values_on_sbatch_and_command_lines_are_refused(field, tmp_path):
    for value in hostile_values(tmp_path / "canary"):
        with pytest.raises(ConfigError) as info:
            parse_config(with_value(field, value))
        message = str(info.value)
        print(message.splitlines()[1])
        assert ".".join(field) in message, f"the error must name the key: {message}"


def test_hostile_env_names_and_multiline_env_values_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="cluster.env"):
        parse_config(with_value(("cluster", "env"), {"X; touch /tmp/y": "1"}))
    with pytest.raises(ConfigError, match="env.X"):
        parse_config(with_value(("cluster", "env"), {"X": "a\ntouch /tmp/y"}))


def test_hostile_env_values_are_inert_when_the_exports_run(tmp_path):
    canary = tmp_path / "canary"
    values = [v for v in hostile_values(canary) if "\n" not in v]
    env = {f"HOSTILE_{i}": v for i, v in enumerate(values)}
    cfg = parse_config(with_value(("cluster", "env"), env))
    script = render_sbatch(cfg, str(tmp_path / "run"))
    exports = [line for line in script.splitlines() if line.startswith("export HOSTILE_")]
    assert len(exports) == len(values)
    # Run exactly the rendered lines, then print each variable back NUL-separated.
    probe = (
        "\n".join(exports) + "\n" + "".join(f'printf "%s\\0" "$HOSTILE_{i}"\n' for i in range(len(values)))
    )
    proc = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not canary.exists(), "a config value executed a command"
    assert proc.stdout.split("\0")[:-1] == values, "each value must arrive unchanged, as one word"


def test_the_template_refuses_what_the_schema_was_bypassed_for(tmp_path):
    """model_copy skips validation: the template's own filters must still refuse."""
    cfg = load_config(REPO / "configs" / "demo-cpu-4node.yaml")
    for value in hostile_values(tmp_path / "canary"):
        bad = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"partition": value})})
        with pytest.raises(ConfigError, match="#SBATCH value"):
            render_sbatch(bad, str(tmp_path / "run"))
        bad_env = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"env": {"A;B": "1"}})})
        with pytest.raises(ConfigError, match="environment variable name"):
            render_sbatch(bad_env, str(tmp_path / "run"))


@pytest.mark.parametrize(
    "run_dir", ["/tmp/a;touch x", "/tmp/$(touch x)", "/tmp/`id`", "/tmp/a b", "/tmp/a\nb", "relative/dir"]
)
def test_hostile_or_relative_run_dirs_are_refused(run_dir):
    cfg = load_config(REPO / "configs" / "demo-cpu-4node.yaml")
    with pytest.raises(ConfigError, match="run directory"):
        render_sbatch(cfg, run_dir)


def test_hostile_job_name_and_excluded_nodes_are_refused(tmp_path):
    cfg = load_config(REPO / "configs" / "demo-cpu-4node.yaml")
    with pytest.raises(ConfigError, match="job name"):
        render_sbatch(cfg, str(tmp_path), job_name="x;id")
    with pytest.raises(ConfigError, match="excluded node"):
        render_sbatch(cfg, str(tmp_path), exclude=["node01", "node02;id"])


def test_command_arguments_are_quoted_words(tmp_path):
    canary = tmp_path / "canary"
    cfg = load_config(REPO / "configs" / "demo-cpu-4node.yaml")
    args = ["printf", "%s|", *hostile_values(canary)]
    script = render_sbatch(cfg, str(tmp_path), command=args)
    exec_line = script[script.index("\nexec ") + 1 :]
    assert exec_line.startswith(f"exec {cfg.cluster.python} -m orchestrator.slurm.launcher --run-dir {tmp_path} ")
    command_text = exec_line[exec_line.index(" -- ") + 4 :]  # the launcher's own words are fixed and safe
    proc = subprocess.run(["bash", "-c", command_text], capture_output=True, text=True, cwd=tmp_path)
    assert not canary.exists()
    assert proc.stdout == "".join(f"{v}|" for v in hostile_values(canary))
    # The same words, shown to the admin in the script's comments, stay comments (one line each).
    shown = [line for line in script.splitlines() if line.startswith("#   srun ")]
    assert shown and all("--kill-on-bad-exit=1" in line for line in shown)
    proc = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0 and not canary.exists(), proc.stderr
