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

import hashlib
import json
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import jinja2

from orchestrator.contract import RunPaths
from orchestrator.contract.textsafe import for_terminal
from orchestrator.contract.values import SLURM_NODE_NAME
from orchestrator.plan.config import ConfigError, RunConfig
from orchestrator.plan.config.site_options import ENV_NAME, SBATCH_OPTION_VALUE, step_options
from orchestrator.plan.config.value_types import SAFE_WORD
from orchestrator.slurm.launcher.srun_lines import (
    Layout,
    health_argv,
    keeps_warm,
    launch_argv,
    node_ranks_argv,
    standby_argv,
)

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


def run_job_name(config_name: str, run_dir: str | os.PathLike[str]) -> str:
    """The name of every job of one run: the config's name and a short hash of the (absolute) run
    directory. SLURM's `--dependency=singleton` is per job name and user, so the jobs of one run
    never overlap, and two runs made from one config (two run directories) never wait for each
    other. The hash keeps the name a safe #SBATCH word whatever the path holds."""
    digest = hashlib.sha256(os.fspath(run_dir).encode()).hexdigest()[:6]
    return f"{config_name}-{digest}"


def _fail(what: str, value: object, allowed: str) -> ConfigError:
    return ConfigError("sbatch", [f"{what} = {value!r}: not allowed in a job script ({allowed})"])


def sbatch_value(value: object) -> str:
    text = str(value)
    if not SBATCH_VALUE.fullmatch(text):
        raise _fail("#SBATCH value", text, f"allowed: {SBATCH_VALUE.pattern}")
    return text


def sbatch_option_value(value: object) -> str:
    """A site's #SBATCH option value (`END,FAIL`, `a100&ib`): no control character, blank, quote
    or backslash, which would end the line or change how sbatch splits it."""
    text = str(value)
    if not re.fullmatch(SBATCH_OPTION_VALUE, text):
        raise _fail("#SBATCH option value", text, "no control character, blank, quote or backslash")
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


def comment_line(value: object) -> str:
    """Text for a comment line of the script: control characters shown as escapes, so that it
    stays one line (a newline would end the comment and start a shell line)."""
    return for_terminal(value)


def json_text(value: object) -> str:
    """The inside of a JSON string (quotes, backslashes, control characters escaped), for a
    report line the job prints with printf."""
    return json.dumps(str(value))[1:-1]


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - a shell script, not HTML: values are shquote'd instead
        keep_trailing_newline=True,
    )
    env.filters.update(
        sbatch_value=sbatch_value,
        sbatch_option_value=sbatch_option_value,
        shquote=shquote,
        env_name=env_name,
        comment_line=comment_line,
        json_text=json_text,
    )
    return env


def render_template(name: str, **values: object) -> str:
    """Another job script of sbatch_templates/ (the probe job's), with the same filters."""
    return _environment().get_template(name).render(**values)


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

    job_name: default `run_job_name(cfg.name, run_dir)` (the singleton dependency is per name and
    user: per run).
    exclude: nodes to avoid (the controller passes nodes it found bad).
    command: the program srun starts on every rank; default `rank_command` (cluster.command, or
    `<cluster.python> -m trainer RUN_DIR`).
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
    name = job_name or run_job_name(cfg.name, run_dir)
    if not re.fullmatch(SAFE_WORD, name):
        problems.append(f"job name {name!r} contains characters that are not allowed (allowed: {SAFE_WORD})")
    for node in exclude:
        if not re.fullmatch(SLURM_NODE_NAME, node):
            problems.append(f"excluded node {node!r} is not a SLURM node name (allowed: {SLURM_NODE_NAME})")
    if problems:
        raise ConfigError("sbatch", problems)
    c = cfg.cluster
    argv = list(command) if command is not None else rank_command(cfg, run_dir)
    if not argv:
        raise ConfigError("sbatch", ["command must not be empty"])
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
            spare_nodes=c.spare_nodes,
            decision_seconds=int(cfg.watchdog.relaunch_decision_seconds),
            setup=[list(words) for words in c.setup],
            launcher_argv=launcher_argv(cfg, run_dir, argv),
            srun_lines=srun_preview(cfg, run_dir, argv),
        )
    )


def trainer_argv(cfg: RunConfig, run_dir: str) -> list[str]:
    """Our trainer: `<cluster.python> -m trainer RUN_DIR`."""
    return [cfg.cluster.python, "-m", "trainer", str(run_dir)]


def rank_command(cfg: RunConfig, run_dir: str) -> list[str]:
    """What each srun task of a launch runs: `cluster.command` (any loop that calls the client;
    with `command_per: node`, behind the shim that gives torchrun its node's variables), else our
    trainer."""
    c = cfg.cluster
    if c.command is None:
        return trainer_argv(cfg, run_dir)
    if c.command_per == "node":
        return node_ranks_argv(c.python, c.gpus_per_node, c.command)
    return list(c.command)


def _layout(cfg: RunConfig) -> Layout:
    c = cfg.cluster
    per_task = c.gpus_per_node if c.command_per == "rank" or c.command is None else 1
    return Layout(
        c.nodes, per_task, c.cpus_per_task * c.gpus_per_node // per_task, SRUN_WAIT_SECONDS,
        site_options=tuple(step_options(c.srun_args, cfg.container)),
    )  # fmt: skip


def _health(cfg: RunConfig) -> bool:
    """The health check runs before the first launch in a job with spares: a failing node is then
    replaced by a spare. Without spares it could only end the job, as the launch would."""
    return cfg.health_check.enabled and cfg.cluster.spare_nodes > 0


def launcher_argv(cfg: RunConfig, run_dir: str, command: Sequence[str]) -> list[str]:
    """What the job script execs: the launcher, with the layout and the trainer command."""
    layout = _layout(cfg)
    decision = int(cfg.watchdog.relaunch_decision_seconds) if cfg.cluster.spare_nodes else 0
    argv = [
        cfg.cluster.launcher_python or cfg.cluster.python, "-m", "orchestrator.slurm.launcher", "--run-dir", run_dir,
        "--python", cfg.cluster.python,
        "--nodes", str(layout.nodes), "--tasks-per-node", str(layout.tasks_per_node),
        "--cpus-per-task", str(layout.cpus_per_task), "--srun-wait", str(layout.srun_wait),
        "--decision-seconds", str(decision),
    ]  # fmt: skip
    if _health(cfg):
        argv += ["--health", "--health-seconds", str(int(cfg.health_check.timeout_seconds))]
    argv += [f"--srun-option={word}" for word in layout.site_options]
    return [*argv, "--", *command]


def srun_preview(cfg: RunConfig, run_dir: str, command: Sequence[str]) -> list[str]:
    """The srun command lines the launcher will run, as shell text, with the nodes SLURM has not
    allocated yet as placeholders (the launcher's own builders: contract of what runs)."""
    layout = _layout(cfg)
    c = cfg.cluster
    total = c.nodes + c.spare_nodes
    allocated = f"<all {total} nodes of the job>"
    chosen = f"<{c.nodes} healthy nodes of the {total}>" if c.spare_nodes else allocated
    python = c.python
    job_dir = str(RunPaths.of(run_dir).job_dir("<job id>"))
    lines = []
    if _health(cfg):
        lines.append(_with_nodes(health_argv(layout, ["?"] * total, python, run_dir, job_dir), allocated))
    lines.append(_with_nodes(launch_argv(layout, 0, ["?"] * c.nodes, command), chosen))
    if c.spare_nodes and keeps_warm(command):
        go = str(RunPaths.of(run_dir).standby_go("<job id>", 1))
        lines.append(_with_nodes(standby_argv(layout, 1, ["?"] * total, python, go, command), allocated))
    return [" ".join(shlex.quote(word) for word in argv) for argv in lines]


def _with_nodes(argv: list[str], placeholder: str) -> list[str]:
    """The line with the node list SLURM will allocate shown as a placeholder."""
    return [f"--nodelist={placeholder}" if word.startswith("--nodelist=") else word for word in argv]
