"""Fixtures of the SLURM layer, registered for every test through `pytest_plugins` in
tests/conftest.py.

- `local_cluster`: a real 4-node SLURM cluster (Debian slurm-wlm), brought up once per session
  under a temporary directory on free ports, and stopped at the end. It installs SLURM with
  apt-get when missing and we are root; without root and without SLURM it skips with the reason.
- `slurm_scheduler`: a SlurmScheduler pointed at that cluster.
- `mock_slurm_dir`: an empty mocked-SLURM state directory (RUNCTL_MOCK_SLURM_DIR is set to it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.slurm.local_cluster import port_busy

TEST_CLUSTER_NODES = 4
TEST_GPUS_PER_NODE = 2


def _ports_free(ports: list[int]) -> bool:
    return not any(port_busy(port) for port in ports)


def _free_port_base(nodes: int) -> tuple[int, int]:
    """(slurmctld port, first slurmd port), away from the default cluster's 16817/17001+."""
    # From 30000: below it is MASTER_PORT's range (10000 + job id % 20000; the job ids of a test
    # cluster start at FirstJobId, derived from its slurmctld port) and a slurmd there would clash.
    for base in range(30000, 40000, 500):
        ctld, slurmd = base + 17, base + 101
        if _ports_free([ctld, *range(slurmd, slurmd + nodes)]):
            return ctld, slurmd
    raise RuntimeError("no free port range for the test cluster between 30000 and 40000")


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory):
    from orchestrator.slurm.local_cluster import ClusterSpec, LocalCluster, find_binary

    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "munged") if find_binary(b) is None]
    if missing and os.geteuid() != 0:
        pytest.skip(f"SLURM not installed ({', '.join(missing)}) and not root to apt-get install it")
    if missing and find_binary("apt-get") is None:
        pytest.skip(f"SLURM not installed ({', '.join(missing)}) and no apt-get (not Debian)")
    if os.geteuid() != 0:
        pytest.skip("the local cluster runs its daemons as SlurmUser=root: run the tests as root")
    # A short path: munge's socket path must stay under 108 characters.
    directory = Path(tmp_path_factory.mktemp("cluster", numbered=True))
    ctld, slurmd = _free_port_base(TEST_CLUSTER_NODES)
    cluster = LocalCluster(directory)
    spec = ClusterSpec(
        nodes=TEST_CLUSTER_NODES, gpus_per_node=TEST_GPUS_PER_NODE, ctld_port=ctld, slurmd_base_port=slurmd
    )
    try:
        cluster.up(spec, timeout=120)
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def slurm_scheduler(local_cluster):
    from orchestrator.slurm.real import SlurmScheduler

    return SlurmScheduler(env=local_cluster.slurm_env())


@pytest.fixture
def mock_slurm_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "mock-slurm"
    directory.mkdir()
    monkeypatch.setenv("RUNCTL_MOCK_SLURM_DIR", str(directory))
    monkeypatch.setenv("RUNCTL_SCHEDULER", "mock")
    return directory
