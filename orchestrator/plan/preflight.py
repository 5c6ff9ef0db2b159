"""Pre-flight on the submit host: what the config names must exist here before any job is queued.

`runctl submit` runs these before it writes anything, the same for --dry-run (the planner's
time budget and fit come first). An error refuses the submission (exit 2); a warning is printed
and the submission goes on. The checks assume what a SLURM site provides: the data, the
checkpoints and the run directory are on a filesystem every node mounts, so a path that is
missing here is missing on the compute nodes too. (`--skip-host-checks` is for reviewing a
config away from its cluster.) The trainer checks the data again when it starts and exits with
the config-error code when it is gone (trainer/loop.py build_datasets): one stop, no restart.

- data.datasets: <path>.bin and <path>.idx are readable files (a misspelt path once crashed
  every restart: FileNotFoundError is a failure, and failures restart and exclude nodes);
- data.tokenizer: readable;
- cluster.python (cluster.launcher_python with a container): an absolute path is an executable
  file; a bare name is found on PATH here (else a warning: the compute nodes may load it with a
  module);
- operators.group: exists (else on-call cannot kill the run); the owner is a member (else the
  controller cannot give control/ to it);
- disk: the checkpoint folder's filesystem holds keep_last + 1 checkpoints of the planner's size
  (a save is written before keep-last deletes the oldest), less those already there;
- notifications: every URL names a service apprise knows, the e-mail addresses are ones it takes.
"""

from __future__ import annotations

import grp
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Level = Literal["error", "warning"]
GIB = 2**30


@dataclass(frozen=True)
class Check:
    level: Level
    message: str


def _readable_file(path: Path) -> str | None:
    """Why `path` is not a readable regular file, or None."""
    if not path.exists():
        return "not found"
    if not path.is_file():
        return "not a regular file"
    if not os.access(path, os.R_OK):
        return "not readable by you"
    return None


def _neighbours(prefix: Path) -> str:
    """What the dataset's folder holds, to spot a misspelling."""
    folder = prefix.parent
    if not folder.is_dir():
        existing = next((p for p in folder.parents if p.is_dir()), None)
        return f" (the folder {folder} does not exist; {existing} does)" if existing else ""
    try:
        names = sorted(p.name[: -len(".idx")] for p in folder.glob("*.idx"))
    except OSError:
        return ""
    if not names:
        return f" (the folder {folder} holds no .idx file)"
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f" (datasets in {folder}: {shown})"


def data_checks(cfg: Any) -> list[Check]:
    checks = []
    for index, entry in enumerate(cfg.data.datasets):
        prefix = Path(entry.path)
        for suffix in (".idx", ".bin"):
            why = _readable_file(prefix.with_name(prefix.name + suffix))
            if why:
                checks.append(Check("error", (
                    f"data.datasets[{index}].path = {entry.path}: {prefix.name}{suffix} {why}{_neighbours(prefix)}. "
                    "Fix the path, or build the dataset (`runctl preprocess`; the CPU configs: `make data`)"
                )))  # fmt: skip
                break
    tokenizer = Path(cfg.data.tokenizer)
    if not tokenizer.exists():
        checks.append(Check("error", f"data.tokenizer = {tokenizer}: not found. Fix the path"))
    elif not os.access(tokenizer, os.R_OK):
        checks.append(Check("error", f"data.tokenizer = {tokenizer}: not readable by you. Fix its mode"))
    return checks


def python_checks(cfg: Any) -> list[Check]:
    """The interpreter the nodes start outside any container: cluster.python, or with a
    `container:` cluster.launcher_python (cluster.python is then inside the image: the probe job
    is what can check it)."""
    key = "cluster.launcher_python" if cfg.container is not None else "cluster.python"
    python = cfg.cluster.launcher_python if cfg.container is not None else cfg.cluster.python
    if "/" in python:
        path = Path(python)
        if not path.is_file():
            return [Check("error", (
                f"{key} = {python}: not found. Give the interpreter of the venv that has bloomctl "
                "installed (e.g. /gpfs/venvs/bloom/bin/python)"
            ))]  # fmt: skip
        if not os.access(path, os.X_OK):
            return [Check("error", f"{key} = {python}: not executable by you. Fix its mode (chmod +x)")]
        return []
    if shutil.which(python) is None:
        return [Check("warning", (
            f"{key} = {python}: not on PATH here; the job finds it only if the compute nodes have it "
            "on PATH. Prefer an absolute path to the venv's python"
        ))]  # fmt: skip
    return []


def group_checks(cfg: Any, user_groups: frozenset[str]) -> list[Check]:
    group = cfg.operators.group
    if not group:
        return [Check("warning", (
            "operators.group is not set: only you (the owner) can kill or resume this run. Set it to the "
            "on-call team's group (docs/security.md)"
        ))]  # fmt: skip
    try:
        grp.getgrnam(group)
    except KeyError:
        return [Check("error", (
            f"operators.group = {group}: no such group on this host, so nobody on call could kill the run. "
            "Give an existing group (`getent group NAME`), ask an admin to create it, or remove the key "
            "(then only the owner can)"
        ))]  # fmt: skip
    if group not in user_groups:
        return [Check("warning", (
            f"operators.group = {group}: you are not a member, so the controller cannot give the run's control/ "
            f"folder to it and only you can kill the run. Ask to join {group} (then log in again)"
        ))]  # fmt: skip
    return []


def disk_checks(
    cfg: Any, checkpoint_dir: Path, checkpoint_bytes: int, free_bytes: int | None = None
) -> list[Check]:
    from orchestrator.contract.checkpoints import list_checkpoints  # noqa: PLC0415 - read-only view

    keep = cfg.checkpoint.keep_last
    there = len([c for c in list_checkpoints(checkpoint_dir) if c.complete])
    count = max(1, keep + 1 - there)
    needed = count * checkpoint_bytes
    probe = checkpoint_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free if free_bytes is None else free_bytes
    if free >= needed:
        return []
    fits = free // checkpoint_bytes if checkpoint_bytes else 0
    already = f" ({there} already there)" if there else ""
    if fits == 0:
        fix = "point checkpoint.dir at a filesystem with room for at least one (the first save would fail)"
    else:
        fix = (
            f"lower checkpoint.keep_last to {max(1, fits + there - 1)} or point checkpoint.dir at a bigger "
            "filesystem (saves would fail once the disk is full)"
        )
    return [Check("error", (
        f"disk: {free / GIB:.1f} GiB free on {probe}, but keep_last + 1 = {keep + 1} checkpoints of "
        f"{checkpoint_bytes / GIB:.1f} GiB{already} need {needed / GIB:.1f} GiB more: {fix}"
    ))]  # fmt: skip


def notification_checks(cfg: Any) -> list[Check]:
    from orchestrator.plan.config.notify_urls import unknown_urls  # noqa: PLC0415 - apprise loads only here

    return [Check("error", why) for why in unknown_urls(cfg.notifications)]


def host_checks(
    cfg: Any, checkpoint_dir: Path, checkpoint_bytes: int, user_groups: frozenset[str]
) -> list[Check]:
    """Every check of the module docstring, errors first."""
    checks = (
        data_checks(cfg)
        + python_checks(cfg)
        + group_checks(cfg, user_groups)
        + disk_checks(cfg, checkpoint_dir, checkpoint_bytes)
        + notification_checks(cfg)
    )
    return sorted(checks, key=lambda c: c.level != "error")
