"""A site's own SLURM options: extra #SBATCH lines, extra srun options, and a container.

Sites need values that a "safe word" refuses: `mail-type: END,FAIL`, `mail-user: a@b.org`,
`constraint: "a100&ib"`, pyxis's `--container-image=nvcr.io#nvidia/pytorch:24.05-py3`. So the
values may hold what sbatch and srun take, and are guarded by where they go instead:
- an #SBATCH line is parsed by sbatch itself, never by a shell, but a newline ends it and sbatch
  splits it at blanks and strips quotes: values there hold no control character, blank, quote or
  backslash (`SBATCH_OPTION_VALUE`);
- an srun option is one argv word of the launcher (no shell), shown shell-quoted in the job
  script: it holds no control character (`SRUN_OPTION_VALUE`).
Keys are long option names. Options the job script or the launcher set themselves (the layout,
the output files, the dependency) are refused here with the key that sets them instead, so a site
option can never contradict what the controller relies on.

The container runs through pyxis (`srun --container-*`), on every step the launcher starts: the
health check, each launch and the warm standby. `cluster.python` is then the interpreter inside
the image, and `cluster.launcher_python` the host's, which runs the launcher outside it.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import PlainValidator, StringConstraints, field_validator

from .section import Section

OPTION_NAME = r"^[a-z][a-z0-9\-]*$"
# Control characters, C0 and C1 (U+0085 is a line break to Python's splitlines), and the Unicode
# line and paragraph separators: none may end a line early in whatever reads the script.
CONTROL = "\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029"
SBATCH_OPTION_VALUE = rf"^[^\s\"'\\`{CONTROL}]+$"
SRUN_OPTION_VALUE = rf"^[^{CONTROL}]+$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # a shell variable name (also cluster.env's keys)
# pyxis: SRC[:DST[:FLAGS]], several joined by commas (so no comma inside one)
CONTAINER_MOUNT = rf"^[^\s,\"'\\`{CONTROL}]+$"

OptionName = Annotated[str, StringConstraints(pattern=OPTION_NAME, max_length=64)]


def _option_value(pattern: str, refused: str) -> object:
    """A text value matching `pattern`, or `true` for an option without a value (`--requeue`,
    `--no-container-mount-home`); the error says both, whichever was meant."""

    def check(value: object) -> str | bool:
        if value is True:
            return True
        if isinstance(value, int) and not isinstance(value, bool):  # `cpus-per-gpu: 8` in YAML
            value = str(value)
        if not isinstance(value, str) or len(value) > 1024 or not re.fullmatch(pattern, value):
            raise ValueError(f"give a text of at most 1024 characters without {refused}, or true for an option "
                             "without a value")  # fmt: skip
        return value

    return PlainValidator(check)


SbatchOptionValue = Annotated[
    str | Literal[True],
    _option_value(SBATCH_OPTION_VALUE, "control characters, blanks, quotes or backslashes"),
]
SrunOptionValue = Annotated[str | Literal[True], _option_value(SRUN_OPTION_VALUE, "control characters")]
SbatchOptions = dict[OptionName, SbatchOptionValue]
SrunOptions = dict[OptionName, SrunOptionValue]

# Set by the job script (sbatch_templates/train.sbatch.j2): name -> the config key that sets it.
SBATCH_OWNED = {
    "job-name": "name", "nodes": "cluster.nodes and cluster.spare_nodes",
    "ntasks-per-node": "cluster.gpus_per_node", "gres": "cluster.gpus_per_node",
    "cpus-per-task": "cluster.cpus_per_task", "time": "cluster.time_limit",
    "partition": "cluster.partition", "account": "cluster.account", "qos": "cluster.qos",
    "exclusive": "cluster.exclusive", "hint": "cluster.hint", "output": "(the run directory)",
    "error": "(the run directory)", "signal": "cluster.pre_timeout_signal/pre_timeout_seconds",
    "exclude": "(the controller's exclusions: runctl nodes)", "dependency": "(the run's chain)",
    "no-kill": "cluster.spare_nodes", "ntasks": "cluster.gpus_per_node",
}  # fmt: skip
# Set by the launcher on every step (orchestrator/slurm/launcher/srun_lines.py).
SRUN_OWNED = {
    "nodes": "cluster.nodes", "ntasks": "cluster.gpus_per_node", "ntasks-per-node": "cluster.gpus_per_node",
    "cpus-per-task": "cluster.cpus_per_task", "nodelist": "(the launcher's choice of nodes)",
    "job-name": "(the launcher)", "kill-on-bad-exit": "(the launcher)", "wait": "(the launcher)",
    "label": "(the launcher)", "overlap": "(the launcher)", "jobid": "(the launcher)",
}  # fmt: skip


def refuse_owned(options: dict[str, object], owned: dict[str, str], where: str) -> dict[str, object]:
    for key in options:
        if key in owned:
            raise ValueError(f"{where}.{key}: set by the job itself; use {owned[key]} instead")
        if where.endswith("srun_args") and key.startswith("container-"):
            raise ValueError(f"{where}.{key}: container options belong in the `container:` section")
    return options


def option_words(options: dict[str, str | bool]) -> list[str]:
    """`--key=value` (or `--key` for true) per option, in key order: argv words, never shell text."""
    return [f"--{key}" if value is True else f"--{key}={value}" for key, value in sorted(options.items())]


class ContainerConfig(Section):
    """pyxis/enroot: what every srun step of the job runs in."""

    # An enroot image: a registry reference (nvcr.io#nvidia/pytorch:24.05-py3) or a squashfs file.
    image: Annotated[str, StringConstraints(pattern=CONTAINER_MOUNT, max_length=1024)]
    # SRC[:DST[:FLAGS]]; the run directory and the data must be among them (or under them).
    mounts: list[Annotated[str, StringConstraints(pattern=CONTAINER_MOUNT, max_length=1024)]] = []
    workdir: Annotated[str, StringConstraints(pattern=CONTAINER_MOUNT, max_length=1024)] | None = None
    # Names of the job's environment variables passed into the container (pyxis --container-env).
    env: list[Annotated[str, StringConstraints(pattern=ENV_NAME, max_length=128)]] = []

    @field_validator("mounts")
    @classmethod
    def _mounts_have_sources(cls, mounts: list[str]) -> list[str]:
        for mount in mounts:
            if not re.fullmatch(r"[^:]+(:[^:]+(:[^:]+)?)?", mount):
                raise ValueError(f"container.mounts: {mount!r} is not SRC[:DST[:FLAGS]]")
        return mounts

    def srun_words(self) -> list[str]:
        """pyxis's srun options for this container, as argv words."""
        words = [f"--container-image={self.image}"]
        if self.mounts:
            words.append(f"--container-mounts={','.join(self.mounts)}")
        if self.workdir:
            words.append(f"--container-workdir={self.workdir}")
        if self.env:
            words.append(f"--container-env={','.join(self.env)}")
        return words


def step_options(srun_args: dict[str, str | bool], container: ContainerConfig | None) -> list[str]:
    """Every srun option the site adds to each step of the job: the container's, then srun_args."""
    return [*(container.srun_words() if container else []), *option_words(srun_args)]
