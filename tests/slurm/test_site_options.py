"""A site's own options: #SBATCH values as sbatch takes them, srun options and a pyxis container
on every step, SLURM's six time forms. Compared with a recorded script, checked by what the
launcher really runs, and fuzzed both ways (no accepted value breaks the script; control
characters are refused naming the key).

Re-record after an intended change, then review the diff:
    RECORD_GOLDEN=1 python -m pytest tests/slurm/test_site_options.py
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.plan.config import ConfigError, parse_config
from orchestrator.slurm.launcher.__main__ import parse_args
from orchestrator.slurm.launcher.srun_lines import health_argv, launch_argv, standby_argv
from orchestrator.slurm.render import render_sbatch

REPO = Path(__file__).resolve().parents[2]
BLOOM = yaml.safe_load((REPO / "configs" / "bloom-176b.yaml").read_text())
GOLDEN = REPO / "tests" / "golden" / "bloom-176b-pyxis.sbatch"
RUN_DIR = "/gpfsscratch/rech/six/commun/runs/tr11-176B-ml"
IMAGE = "nvcr.io#nvidia/pytorch:24.05-py3"
SITE = {
    "time_limit": "4-04:00",
    "launcher_python": "/gpfs/venvs/runctl/bin/python",
    "python": "/usr/bin/python3",
    "extra_sbatch": {"mail-type": "END,FAIL", "mail-user": "oncall@bigscience.org", "constraint": "a100&ib",
                     "requeue": True},
    "srun_args": {"mpi": "pmix", "no-container-mount-home": True},
}  # fmt: skip
CONTAINER = {
    "image": IMAGE,
    "mounts": ["/gpfsscratch:/gpfsscratch", "/gpfswork/data:/data:ro"],
    "workdir": "/gpfsscratch",
    "env": ["NCCL_DEBUG", "HF_HOME"],
}
PYXIS_WORDS = [f"--container-image={IMAGE}", "--container-mounts=/gpfsscratch:/gpfsscratch,/gpfswork/data:/data:ro",
               "--container-workdir=/gpfsscratch", "--container-env=NCCL_DEBUG,HF_HOME", "--mpi=pmix",
               "--no-container-mount-home"]  # fmt: skip


def config(cluster: dict | None = None, container: dict | None = CONTAINER) -> dict:
    data = copy.deepcopy(BLOOM)
    data["cluster"].update(SITE if cluster is None else cluster)
    if container is not None:
        data["container"] = container
    return data


def sbatch_lines(text: str) -> dict[str, str]:
    return dict(
        (m.group(1), m.group(2) if m.group(2) is not None else "")
        for m in re.finditer(r"^#SBATCH --([a-z\-]+)(?:=(.*))?$", text, re.M)
    )


def exec_argv(text: str) -> list[str]:
    # split at newlines only: bash does (str.splitlines also breaks at U+0085 and U+2028)
    line = next(line for line in text.split("\n") if line.startswith("exec "))
    return shlex.split(line)[1:]


def test_the_pyxis_script_matches_the_recorded_file():
    text = render_sbatch(parse_config(config()), RUN_DIR)
    if os.environ.get("RECORD_GOLDEN") == "1":
        GOLDEN.write_text(text)
        pytest.skip(f"re-recorded {GOLDEN}: review `git diff {GOLDEN.relative_to(REPO)}`")
    assert GOLDEN.read_text() == text, f"the script changed; if intended: RECORD_GOLDEN=1 pytest {__file__}"


def test_site_options_reach_sbatch_and_every_step_the_launcher_runs(tmp_path):
    text = render_sbatch(parse_config(config()), RUN_DIR)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    sbatch = sbatch_lines(text)
    assert sbatch["mail-type"] == "END,FAIL" and sbatch["mail-user"] == "oncall@bigscience.org"
    assert sbatch["constraint"] == "a100&ib" and sbatch["requeue"] == ""
    assert sbatch["time"] == "100:00:00", "4-04:00 is 100 hours, in the canonical form"
    argv = exec_argv(text)
    assert argv[:3] == ["/gpfs/venvs/runctl/bin/python", "-m", "orchestrator.slurm.launcher"], "the host's python"
    plan = parse_args(argv[3:])
    assert plan.command == ["/usr/bin/python3", "-m", "trainer", RUN_DIR], "the image's python"
    nodes = ["n1", "n2"]
    steps = {
        "launch": launch_argv(plan.layout, 0, nodes, plan.command),
        "standby": standby_argv(plan.layout, 1, nodes, plan.command[0], "/go", plan.command),
        "health": health_argv(plan.layout, nodes, plan.command[0], RUN_DIR, "/job"),
    }
    for name, step in steps.items():
        program = step.index("/usr/bin/python3")
        assert step[program - len(PYXIS_WORDS) : program] == PYXIS_WORDS, (name, step)
    # What the admin reads in the script is what runs.
    for name in ("launch-0", "health-check", "standby-1"):
        preview = next(line for line in text.splitlines() if f"--job-name={name}" in line)
        assert all(shlex.quote(word) in preview for word in PYXIS_WORDS), (name, preview)


@pytest.mark.parametrize(
    ("given", "kept"),
    [("90", "01:30:00"), ("90:30", "01:30:30"), ("100:00:00", "100:00:00"), ("4-04", "100:00:00"),
     ("4-04:00", "100:00:00"), ("1-02:03:04", "26:03:04"), (" 30 ", "00:30:00")],
)  # fmt: skip
def test_every_slurm_time_form_is_taken_and_kept_in_one_form(given, kept):
    assert parse_config(config({"time_limit": given}, None)).cluster.time_limit == kept


@pytest.mark.parametrize("bad", ["", "UNLIMITED", "1:2:3:4", "10:61", "1-", "-5", "0", "1.5:00:00", "4-04:00 x"])
def test_bad_time_limits_are_refused_naming_the_forms(bad):
    with pytest.raises(ConfigError) as info:
        parse_config(config({"time_limit": bad}, None))
    message = str(info.value)
    assert "cluster.time_limit" in message and "D-H:M" in message or "below 60" in message or "zero" in message


@pytest.mark.parametrize(
    ("cluster", "named"),
    [({"extra_sbatch": {"time": "10"}}, "cluster.time_limit"), ({"extra_sbatch": {"nodes": "2"}}, "cluster.nodes"),
     ({"srun_args": {"nodelist": "n1"}}, "the launcher's choice"),
     ({"srun_args": {"container-image": "x"}}, "`container:` section"),
     ({"extra_sbatch": {"comment": "two words"}}, "cluster.extra_sbatch.comment"),
     ({"extra_sbatch": {"comment": "it's"}}, "cluster.extra_sbatch.comment"),
     ({"srun_args": {"mpi": "pmix\n"}}, "cluster.srun_args.mpi"),
     ({"extra_sbatch": {"Mail": "x"}}, "cluster.extra_sbatch")],
)  # fmt: skip
def test_options_the_job_sets_itself_and_unsafe_values_are_refused_naming_the_key(cluster, named):
    with pytest.raises(ConfigError) as info:
        parse_config(config(cluster, None))
    assert named in str(info.value), str(info.value)


def test_a_container_needs_a_host_python_for_the_launcher():
    with pytest.raises(ConfigError, match="cluster.launcher_python"):
        parse_config(config({}, CONTAINER))


@pytest.mark.parametrize("mount", ["/a,/b", "/a b", "/a:/b:ro:x", ":/b"])
def test_bad_container_mounts_are_refused(mount):
    with pytest.raises(ConfigError, match="container.mounts"):
        parse_config(config(None, {**CONTAINER, "mounts": [mount]}))


def is_control(char: str) -> bool:
    return ord(char) < 32 or 0x7F <= ord(char) <= 0x9F or char in "\u2028\u2029"


# -- fuzz: whatever is accepted renders a script whose lines say exactly what was given ------------
option_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=24)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sbatch_value=option_text, srun_value=option_text, mount=option_text)
def test_accepted_values_never_break_the_script(sbatch_value, srun_value, mount, tmp_path_factory):
    cluster = {**SITE, "extra_sbatch": {"comment": sbatch_value}, "srun_args": {"mpi": srun_value}}
    try:
        cfg = parse_config(config(cluster, {**CONTAINER, "mounts": [mount]}))
    except ConfigError as exc:
        assert any(k in str(exc) for k in ("extra_sbatch.comment", "srun_args.mpi", "container.mounts")), exc
        assert any(is_control(c) for c in sbatch_value + srun_value + mount) or not re.fullmatch(
            r"[^\s\"'\\`]+", sbatch_value
        ) or not re.fullmatch(r"[^\s,\"'\\`]+", mount) or ":" in mount, "refused something sbatch and srun take"
        return
    text = render_sbatch(cfg, RUN_DIR)
    script = tmp_path_factory.mktemp("fuzz") / "job.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert sbatch_lines(text)["comment"] == sbatch_value
    assert f"--srun-option=--mpi={srun_value}" in exec_argv(text)
    assert f"--srun-option=--container-mounts={mount}" in exec_argv(text)
    assert len(sbatch_lines(text)) == text.count("\n#SBATCH "), "one option per #SBATCH line"


@settings(max_examples=100, deadline=None)
@given(prefix=option_text, control=st.sampled_from(["\n", "\r", "\x00", "\x1b", "\x7f", "\t", "\x85", "\u2028"]))
def test_control_characters_are_refused_naming_the_key(prefix, control):
    for cluster, key in (({"extra_sbatch": {"comment": prefix + control}}, "extra_sbatch.comment"),
                         ({"srun_args": {"mpi": prefix + control}}, "srun_args.mpi")):  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(key)):
            parse_config(config({**SITE, **cluster}, CONTAINER))
