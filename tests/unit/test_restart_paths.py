"""The restart-path table (orchestrator/plan/restart_paths.py): BLOOM's figures are bytes / bandwidth
by the stated rule, and the planner and the simulation charge the same numbers from it."""

from __future__ import annotations

import pytest

from orchestrator.plan.config import ConfigError, parse_config
from orchestrator.plan.planner import checkpoint_bytes, count_parameters, plan_run
from orchestrator.plan.restart_paths import LoadSource, RestartPaths
from simulation.timings import Timings
from tests.unit.test_planner import BLOOM, _bloom_with

TB = 2.467461799936e12  # the planner's BLOOM checkpoint: bf16 weights + fp32 master + Adam


def _paths(**changes) -> tuple[RestartPaths, object]:
    cfg = parse_config(_bloom_with(**changes))
    return RestartPaths.of(cfg, checkpoint_bytes(count_parameters(cfg))), cfg


def test_bloom_paths_are_bytes_over_bandwidth() -> None:
    paths, _ = _paths()
    assert paths.checkpoint_bytes == pytest.approx(TB, rel=1e-9)
    per_rank, per_node = TB / 384, TB / 48
    hashing = per_rank / 1.45e9
    expected = {
        LoadSource.SHARED: TB / (TB / 300) + hashing,  # checkpoint.save_seconds: 300 s for the whole
        LoadSource.MEMORY: per_rank / 6.6e9 + hashing,
        LoadSource.DISK: per_node / 6.5e9 + hashing,
        LoadSource.PEER: per_node / 40e9 + hashing,
    }
    for source, seconds in expected.items():
        print(f"{source.value:<7} {paths.load_seconds(source):8.2f} s (by hand {seconds:8.2f} s)")
        assert paths.load_seconds(source) == pytest.approx(seconds, rel=1e-12)
    # local_copy memory + peer_copy: survivors read host memory, the replacement its buddy's replica.
    assert paths.in_allocation_load() == (pytest.approx(max(per_rank / 6.6e9, per_node / 40e9) + hashing), LoadSource.MEMORY)
    assert paths.start_seconds(standby=True) == pytest.approx(645 * 0.111)
    assert paths.start_seconds(standby=False) == 645
    print("in allocation", paths.in_allocation_seconds(), "job-level", paths.job_level_seconds())
    assert paths.in_allocation_seconds() < 160 < 1500 < paths.job_level_seconds()


def test_without_copies_a_relaunch_reads_the_shared_filesystem() -> None:
    paths, _ = _paths(recovery__local_copy="none", recovery__peer_copy=False)
    assert paths.in_allocation_load() == (paths.load_seconds(LoadSource.SHARED), LoadSource.SHARED)
    no_peer, _ = _paths(recovery__peer_copy=False)
    alone = TB / 48 / (TB / 300)  # the replacement node reads its share from the shared filesystem alone
    assert no_peer.in_allocation_load()[0] == pytest.approx(alone + no_peer.verify_seconds())


def test_planner_and_simulation_charge_the_same_table() -> None:
    paths, cfg = _paths()
    plan = plan_run(cfg)
    assert plan.in_allocation_restart_hours * 3600 == pytest.approx(paths.in_allocation_seconds())
    assert plan.job_restart_hours * 3600 == pytest.approx(paths.job_level_seconds())
    timings = Timings.from_config(cfg)
    assert timings.load_seconds == pytest.approx(paths.load_seconds(LoadSource.SHARED))
    assert timings.launch_seconds + timings.init_seconds == pytest.approx(paths.start_seconds(standby=False))
    assert timings.queue_wait_mean_seconds == paths.queue_wait_seconds
    # A config's own restart minutes still win (a site that measured its own).
    fixed = plan_run(parse_config(_bloom_with(watchdog__restart_minutes=30, watchdog__in_allocation_restart_minutes=3)))
    assert (fixed.job_restart_hours, fixed.in_allocation_restart_hours) == (0.5, 0.05)


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"recovery__peer_copy": True, "recovery__local_copy": "none"}, "peer_copy: true needs recovery.local_copy"),
        ({"checkpoint__min_interval_hours": 5, "checkpoint__max_interval_hours": 2}, "min_interval_hours = 5 is above"),
        ({"checkpoint__interval_hours": None, "checkpoint__interval_steps": 100}, "re-fits interval_hours, which is not set"),
        ({"recovery__network_gb_per_second_per_node": 0}, "network_gb_per_second_per_node"),
    ],
)
def test_bad_recovery_and_interval_settings_are_named(changes, words) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_bloom_with(**changes))
    assert words in str(caught.value), str(caught.value)


def test_bloom_config_prices_its_restarts() -> None:
    assert BLOOM.name == "bloom-176b.yaml"
    plan = plan_run(parse_config(_bloom_with()))
    assert plan.restart_times_from == "recovery" and plan.adaptive_interval == "apply"
