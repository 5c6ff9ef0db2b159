"""Render the training job's sbatch script from a run config.

    text = render_sbatch(cfg, run_dir)                   # the script `runctl submit` writes
    text = render_sbatch(cfg, run_dir, command=["hostname"])   # same script, another program (tests)

Values are guarded twice: the config schema refuses unsafe characters, and the template passes
every value through a filter: `sbatch_value` (validated, for #SBATCH lines, which sbatch parses
without a shell) or `shquote` (shlex.quote, for shell lines). A value that fails raises ConfigError
naming the value, so a hostile config never yields a script. Patterns are applied with
`fullmatch`: `re.match(...$)` accepts a trailing newline, and a newline before the #SBATCH lines
makes sbatch ignore every one of them. The template's comment lines use the same filters (a
comment ends at a newline too).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import jinja2

from orchestrator.config import ConfigError, RunConfig
from orchestrator.config.schema import ENV_NAME, SAFE_WORD, SLURM_NODE_NAME

TEMPLATE_NAME = "train.sbatch.j2"
# Characters sbatch takes literally on an #SBATCH line: no space, quote, `$`, `;`, backslash.
SBATCH_VALUE = re.compile(r"[A-Za-z0-9_.+\-/:=@,%\[\]]+")
SRUN_WAIT_SECONDS = 60


def template_dir() -> Path:
    """sbatch_templates/ of this checkout; RUNCTL_TEMPLATES overrides (e.g. for an installed copy)."""
    override = os.environ.get("RUNCTL_TEMPLATES")
    if override:
        return Path(override)
    checkout = Path(__file__).resolve().parents[2] / "sbatch_templates"
    if checkout.is_dir():
        return checkout
    # A non-editable install ships them as data files under <prefix>/share/bloomctl/ (setup.cfg).
    return Path(sys.prefix) / "share" / "bloomctl" / "sbatch_templates"


def _fail(what: str, value: object, allowed: str) -> ConfigError:
    return ConfigError("sbatch", [f"{what} = {value!r}: not allowed in a job script ({allowed})"])


def sbatch_value(value: object) -> str:
    text = str(value)
    if not SBATCH_VALUE.fullmatch(text):
        raise _fail("#SBATCH value", text, f"allowed: {SBATCH_VALUE.pattern}")
    return text


def shquote(value: object) -> str:
    text = str(value)
    if "\x00" in text:
        raise _fail("shell value", text, "NUL byte")
    return shlex.quote(text)


def env_name(value: object) -> str:
    text = str(value)
    if not re.fullmatch(ENV_NAME, text):
        raise _fail("environment variable name", text, f"allowed: {ENV_NAME}")
    return text


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - a shell script, not HTML: values are shquote'd instead
        keep_trailing_newline=True,
    )
    env.filters.update(sbatch_value=sbatch_value, shquote=shquote, env_name=env_name)
    return env


def render_sbatch(
    cfg: RunConfig,
    run_dir: str | os.PathLike[str],
    *,
    job_name: str | None = None,
    exclude: Sequence[str] = (),
    command: Sequence[str] | None = None,
    dependency: str | None = "singleton",
) -> str:
    """The batch script for one job of the run in `run_dir` (absolute; not created here).

    job_name: default the config's name (the singleton dependency is per name and user).
    exclude: nodes to avoid (the controller passes nodes it found bad).
    command: the program srun starts on every rank; default `<cluster.python> -m trainer RUN_DIR`.
    dependency: "singleton" by default, so two jobs of one run never overlap; None to drop it.
    """
    run_dir = str(run_dir)
    problems = []
    if not os.path.isabs(run_dir):
        problems.append(f"run directory {run_dir!r} must be an absolute path (the job runs on other nodes)")
    if not SBATCH_VALUE.fullmatch(run_dir):
        problems.append(
            f"run directory {run_dir!r} contains characters not allowed in a job script (allowed: {SBATCH_VALUE.pattern})"
        )
    name = job_name or cfg.name
    if not re.fullmatch(SAFE_WORD, name):
        problems.append(f"job name {name!r} contains characters that are not allowed (allowed: {SAFE_WORD})")
    for node in exclude:
        if not re.fullmatch(SLURM_NODE_NAME, node):
            problems.append(f"excluded node {node!r} is not a SLURM node name (allowed: {SLURM_NODE_NAME})")
    if problems:
        raise ConfigError("sbatch", problems)
    c = cfg.cluster
    argv = list(command) if command is not None else [c.python, "-m", "trainer", run_dir]
    if not argv:
        raise ConfigError("sbatch", ["command must not be empty"])
    health = cfg.health_check  # runs under the in-allocation launcher (jobs with spares)
    return (
        _environment()
        .get_template(TEMPLATE_NAME)
        .render(
            job_name=name,
            run_dir=run_dir,
            nodes=c.nodes,
            gpus_per_node=c.gpus_per_node,
            cpus_per_task=c.cpus_per_task,
            time_limit=c.time_limit,
            partition=c.partition,
            account=c.account,
            qos=c.qos,
            exclusive=c.exclusive,
            accelerator=c.accelerator,
            hint=c.hint,
            extra_sbatch=sorted(c.extra_sbatch.items()),
            pre_timeout_signal=c.pre_timeout_signal,
            pre_timeout_seconds=c.pre_timeout_seconds,
            exclude=list(exclude),
            dependency=dependency,
            env=sorted(c.env.items()),
            tp=cfg.parallel.tp,
            pp=cfg.parallel.pp,
            dp=cfg.dp,
            srun_wait=SRUN_WAIT_SECONDS,
            command=argv,
            spare_nodes=c.spare_nodes,
            launcher_python=c.python,
            decision_seconds=int(cfg.watchdog.relaunch_decision_seconds),
            health_check=health.enabled,
            health_seconds=int(health.timeout_seconds),
        )
    )
