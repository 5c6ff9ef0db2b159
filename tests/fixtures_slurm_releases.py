"""Fixtures of the other real SLURMs: Debian 13's 24.11 beside the host's 22.05, and accounting.

- `local_cluster_2411`: a real 4-node cluster of Debian 13's Slurm 24.11, run from a debootstrapped
  root in namespaces of its own (orchestrator/slurm/isolated.py); our code stays on the host and
  calls its commands through `slurm_env()`.
- `accounted_cluster`: the host's 22.05 with slurmdbd and MariaDB of its own, so `sacct` is real.

The root (~40 s on a fast mirror, minutes on a slow one) is built once per machine and kept in
/var/cache/runctl. On a fresh machine it builds in the background from the start of the session,
and the tests that need it run last, so the build overlaps the rest of the suite.

Not root, or the build fails: a skip with the reason, and under CI (env CI) a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import _in_ci
from tests.fixtures_slurm import TEST_CLUSTER_NODES, TEST_GPUS_PER_NODE, _free_port_base

FIXTURE_2411 = "local_cluster_2411"
BUILD_TIMEOUT = 900.0
_build: dict[str, object] = {}


def _not_here(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"CI is set, so this fails instead of skipping: {reason}")
    pytest.skip(reason)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: build only for tests that will run
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = [item for item in items if FIXTURE_2411 in getattr(item, "fixturenames", ())]
    if not wanted:
        return
    chosen = set(wanted)
    items[:] = [item for item in items if item not in chosen] + wanted
    _start_root_build()


def _start_root_build() -> None:
    from orchestrator.slurm.local_cluster import find_binary
    from orchestrator.slurm.trixie_root import TrixieRoot, _apt_install_host

    root = TrixieRoot()
    if root.ready() or os.geteuid() != 0 or "process" in _build:
        return
    if find_binary("debootstrap") is None:
        try:  # now, before any test's apt-get: two at once would fight over dpkg's lock
            _apt_install_host(["debootstrap"])
        except Exception as error:  # noqa: BLE001 - reported by the fixture, with the reason
            _build["error"] = str(error)
            return
    log = open(root.dir.parent / f"{root.dir.name}.session.log", "ab") if root.dir.parent.is_dir() else subprocess.DEVNULL  # noqa: SIM115
    _build["started"] = time.time()
    _build["process"] = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.slurm.trixie_root"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _wait_for_root():
    from orchestrator.slurm.trixie_root import TrixieRoot

    root = TrixieRoot()
    process = _build.get("process")
    if isinstance(process, subprocess.Popen):
        waited = time.time()
        try:
            process.wait(timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
        print(f"24.11 root: built in the background in {waited - float(_build['started']):.0f} s "
              f"before it was needed, waited {time.time() - waited:.1f} s more")  # fmt: skip
    if "error" in _build:
        _not_here(f"cannot build the 24.11 root: {_build['error']}")
    if not root.ready():
        root.ensure()  # not started in the background (a single test run): build now, errors raised
    return root


@pytest.fixture(scope="session")
def local_cluster_2411(tmp_path_factory: pytest.TempPathFactory):
    from orchestrator.slurm.isolated import IsolatedCluster
    from orchestrator.slurm.local_cluster import ClusterSpec

    if os.geteuid() != 0:
        _not_here("the 24.11 cluster needs root (debootstrap, namespaces, chroot)")
    root = _wait_for_root()
    cluster = IsolatedCluster(Path(tmp_path_factory.mktemp("c2411", numbered=True)), root=root)
    # Its own network namespace: any ports will do.
    spec = ClusterSpec(nodes=TEST_CLUSTER_NODES, gpus_per_node=TEST_GPUS_PER_NODE, ctld_port=24117, slurmd_base_port=24201)
    try:
        cluster.up(spec, timeout=120, install=False)
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def accounted_cluster(tmp_path_factory: pytest.TempPathFactory):
    from orchestrator.slurm.accounting import AccountedCluster
    from orchestrator.slurm.local_cluster import ClusterSpec

    if os.geteuid() != 0:
        _not_here("the cluster with accounting runs slurmdbd and MariaDB as root: run the tests as root")
    cluster = AccountedCluster(Path(tmp_path_factory.mktemp("acct", numbered=True)))
    ctld, slurmd = _free_port_base(2)
    try:
        cluster.up(ClusterSpec(nodes=2, gpus_per_node=0, ctld_port=ctld, slurmd_base_port=slurmd), timeout=120)
        yield cluster
    finally:
        cluster.down()
