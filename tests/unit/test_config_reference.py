"""docs/config.md holds every key of the schema: it is what orchestrator.plan.config.reference prints."""

from __future__ import annotations

from orchestrator.plan.config.reference import reference, rows
from orchestrator.plan.config.schema import RunConfig
from tests.conftest import REPO_ROOT


def test_the_reference_is_up_to_date():
    assert (REPO_ROOT / "docs" / "config.md").read_text() == reference(), (
        "docs/config.md is out of date: python -m orchestrator.plan.config.reference > docs/config.md"
    )


def test_every_key_of_every_section_is_listed():
    keys = {key for key, _, _ in rows(RunConfig)}
    for key in ("cluster.setup", "cluster.srun_args", "container.image", "exclusions.probation_hours",
                "notifications.events", "health.policy.loss_spike", "watchdog.progress_floor_seconds"):
        assert key in keys or any(k.startswith(key + ".") for k in keys), key
    assert len(keys) > 150
