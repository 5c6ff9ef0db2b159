"""Will the next checkpoint fit? Checked on every pass, reported when the answer changes.

BLOOM lost hours to a full disk. The expected size of the next checkpoint is the last complete
one's size once there is one, else the planner's estimate. A save writes the new checkpoint
before keep-last cleanup deletes an old one, so the space needed is one whole checkpoint plus a
margin. Levels: ok; "warning" when free < margin x expected (warned while there is still time
to clean up); "critical" when free < expected (the next save will fail).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

WARNING_MARGIN = 1.5


@dataclass
class DiskCheck:
    level: str  # "ok" | "warning" | "critical" | "unknown"
    free_bytes: int
    expected_bytes: int | None
    source: str  # where the expected size came from
    path: str

    def message(self, next_due_in: float | None = None) -> str:
        due = f", next checkpoint due in {next_due_in / 60:.0f} min" if next_due_in is not None else ""
        if self.expected_bytes is None:
            return f"{gib(self.free_bytes)} free on {self.path}; checkpoint size unknown{due}"
        return (
            f"{gib(self.free_bytes)} free on {self.path}, next checkpoint needs ~{gib(self.expected_bytes)} "
            f"({self.source}){due}"
        )


def gib(n: int | float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def check_disk(
    checkpoint_dir: Path,
    last_checkpoint_bytes: int | None,
    planned_bytes: int | None,
    free_bytes: int | None = None,
) -> DiskCheck:
    path = Path(checkpoint_dir)
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the directory may not exist before the first save
    if free_bytes is None:
        free_bytes = shutil.disk_usage(probe).free
    if last_checkpoint_bytes:
        expected, source = int(last_checkpoint_bytes), "size of the last checkpoint"
    elif planned_bytes:
        expected, source = int(planned_bytes), "planner's estimate"
    else:
        return DiskCheck("unknown", free_bytes, None, "no estimate", str(probe))
    if free_bytes < expected:
        level = "critical"
    elif free_bytes < WARNING_MARGIN * expected:
        level = "warning"
    else:
        level = "ok"
    return DiskCheck(level, free_bytes, expected, source, str(probe))


def planned_checkpoint_bytes(cfg) -> int | None:
    """The planner's estimate, if the planner module offers one (it is optional here)."""
    try:
        from orchestrator.planner import plan_run  # noqa: PLC0415 - optional, heavy-ish
    except ImportError:
        return None
    try:
        plan = plan_run(cfg)
    except Exception:  # a planner bug must not stop supervision
        return None
    for name in ("checkpoint_bytes", "checkpoint_size_bytes"):
        value = getattr(plan, name, None)
        if value:
            return int(value)
    return None
