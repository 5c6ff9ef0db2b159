"""What tests read back from a run directory, through the contract's own typed readers (so every
test also exercises them), as plain dicts where a test compares whole records."""

from __future__ import annotations

from typing import Any

from orchestrator.contract import RunPaths
from orchestrator.contract.events import read_events


def event_dicts(paths: RunPaths) -> list[dict[str, Any]]:
    """Every event of the run, read as its typed record and turned back into its JSON form."""
    return [event.to_dict() for event in read_events(paths.events)]
