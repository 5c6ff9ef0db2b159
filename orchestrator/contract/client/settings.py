"""What a rank needs of the frozen run config (`run.yaml`), read without the config package.

The controller froze `run.yaml` with every key (orchestrator.plan.config.dump_config), validated; a
rank reads the few values the contract's client acts on with a plain YAML parser: pydantic and
the schema stay on the login node, and a loop that is not ours starts fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract import ContractError


@dataclass(frozen=True)
class RunSettings:
    heartbeat_seconds: float = 10.0  # watchdog.heartbeat_seconds
    pre_timeout_signal: str | None = None  # cluster.pre_timeout_signal, e.g. "USR1"
    exit_duration_minutes: float | None = None  # checkpoint.exit_duration_minutes
    checkpoint_interval_hours: float | None = None  # checkpoint.interval_hours
    checkpoint_dir: str | None = None  # checkpoint.dir (None: <run_dir>/checkpoints)
    keep_last: int = 2  # checkpoint.keep_last

    @classmethod
    def from_config(cls, data: Any) -> RunSettings:
        def section(name: str) -> dict:
            value = data.get(name) if isinstance(data, dict) else None
            return value if isinstance(value, dict) else {}

        watchdog, cluster, checkpoint = section("watchdog"), section("cluster"), section("checkpoint")
        try:
            return cls(
                heartbeat_seconds=float(watchdog.get("heartbeat_seconds", cls.heartbeat_seconds)),
                pre_timeout_signal=cluster.get("pre_timeout_signal") or None,
                exit_duration_minutes=_optional_float(checkpoint.get("exit_duration_minutes")),
                checkpoint_interval_hours=_optional_float(checkpoint.get("interval_hours")),
                checkpoint_dir=checkpoint.get("dir") or None,
                keep_last=int(checkpoint.get("keep_last", cls.keep_last)),
            )
        except (TypeError, ValueError) as exc:
            raise ContractError(
                f"run.yaml: {exc} (the controller writes it: resubmit with `runctl submit`)"
            ) from None


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def read_settings(config: Path) -> RunSettings:
    """The settings of `config` (RUN_DIR/run.yaml). ContractError when it is missing or unreadable."""
    import yaml  # a dependency of the controller's package; imported here, when a rank starts

    try:
        text = Path(config).read_text()
    except OSError as exc:
        raise ContractError(
            f"cannot read {config}: {exc.strerror} (is RUNCTL_RUN_DIR the run's directory?)"
        ) from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return RunSettings.from_config(yaml.load(text, Loader=loader))  # noqa: S506 - a safe loader
