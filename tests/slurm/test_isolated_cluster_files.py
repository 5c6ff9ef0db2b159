"""The 24.11 cluster's pieces that need no root: the root's recipe stamp, the paths bound into its
namespace, and its command wrappers (the real cluster runs in test_e2e_slurm_2411.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.slurm.isolated import CLIENT_COMMANDS, REPO_ROOT, IsolatedCluster, shared_paths
from orchestrator.slurm.trixie_root import STAMP_NAME, TrixieRoot, recipe_stamp


def test_a_root_of_another_recipe_or_half_built_is_not_ready(tmp_path: Path) -> None:
    root = TrixieRoot(tmp_path / "root")
    assert not root.ready()  # absent
    (tmp_path / "root").mkdir()
    assert not root.ready()  # a build killed before its stamp
    (tmp_path / "root" / STAMP_NAME).write_text("0123456789abcdef\n")
    assert not root.ready()  # an older package list
    (tmp_path / "root" / STAMP_NAME).write_text(recipe_stamp() + "\n")
    assert root.ready()


def test_shared_paths_hold_the_repo_python_and_cluster_dir_once_each(tmp_path: Path) -> None:
    cluster_dir = Path("/tmp") / "some-cluster"
    paths = shared_paths(cluster_dir)
    covered = lambda p: any(str(Path(p).resolve()) == k or str(Path(p).resolve()).startswith(k + "/") for k in paths)  # noqa: E731
    for needed in (cluster_dir, REPO_ROOT, sys.prefix, sys.base_prefix, Path(sys.executable).resolve()):
        assert covered(needed), (needed, paths)
    assert not [p for p in paths if any(p != k and p.startswith(k + "/") for k in paths)], paths
    assert "/" not in paths


def test_wrappers_enter_the_namespace_from_outside_and_run_directly_inside(tmp_path: Path) -> None:
    cluster = IsolatedCluster(tmp_path)
    (tmp_path / "log").mkdir()
    cluster.init_pid_file.write_text("4242\n")
    cluster._write_wrappers()
    for name in CLIENT_COMMANDS:
        text = (cluster.bin_dir / name).read_text()
        assert "exec nsenter --target=4242 --net --mount --pid --root --wdns=/ -- " in text
        assert f'exec /usr/bin/{name} "$@"' in text  # a job inside (the launcher's scontrol) calls it
    assert cluster.env()["PATH"].startswith(f"{cluster.bin_dir}:")
