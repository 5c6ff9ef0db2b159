"""The sbatch and srun options we use, accepted by both real releases (22.05 and 24.11).

`sbatch --test-only` / `srun --test-only` make slurmctld parse and place a job without running it:
our rendered job script (spares, exclude list, --signal, --gres, --no-kill, --exclusive, --hint,
singleton dependency) and the launcher's srun lines (launch, warm standby with --overlap, health
check) must be accepted by each. The forms that moved between releases are asked too, and the
table printed is the one in docs/slurm.md ("Options that moved between releases").
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.plan.config import parse_config
from orchestrator.plan.config.load import resolve_paths

pytestmark = [pytest.mark.slurm]
REPO = Path(__file__).resolve().parents[2]
# Each form: what we need of it. "ours": rendered by us; the others are documented, not used.
FORMS = {
    "--gres=gpu:2": "ours (every release)",
    "--gpus-per-node=2": "not used (19.05+)",
    "--signal=USR1@60": "ours",
    "--signal=B:USR1@60": "not used",
    "--signal=R:USR1@60": "not used: 24.11 refuses it without preemption",
}


def _test_only(cluster, argv: list[str], cwd: Path) -> tuple[bool, str]:
    import subprocess

    proc = subprocess.run(argv, env=cluster.slurm_env(), cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    said = (proc.stderr + proc.stdout).strip().splitlines()
    return proc.returncode == 0 and "to start at" in proc.stderr, said[-1] if said else "(nothing)"


def _config(tmp_path: Path):
    data = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    data["cluster"].update(
        nodes=2, gpus_per_node=2, spare_nodes=1, python=sys.executable, exclusive=True, hint="nomultithread"
    )
    return resolve_paths(parse_config(data, source="options"), REPO / "configs")


def test_our_sbatch_and_srun_options_are_accepted_by_22_05_and_24_11(local_cluster, local_cluster_2411, tmp_path_factory):
    from orchestrator.slurm.launcher.srun_lines import Layout, health_argv, launch_argv, standby_argv
    from orchestrator.slurm.render import render_sbatch

    folder = Path(tmp_path_factory.mktemp("options"))  # under /tmp: seen by both clusters
    cfg = _config(folder)
    script = folder / "job.sbatch"
    script.write_text(render_sbatch(cfg, str(folder / "run"), exclude=["node04"]))
    layout = Layout(2, 2, 1, 30)
    nodes = ["node01", "node02"]
    srun_lines = {
        "launch": launch_argv(layout, 0, nodes, ["true"]),
        "standby": standby_argv(layout, 1, nodes, sys.executable, str(folder / "go"), ["true"]),
        "health": health_argv(layout, nodes, sys.executable, str(folder / "run"), str(folder / "job")),
    }
    table: dict[str, dict[str, tuple[bool, str]]] = {}
    for release, cluster in (("22.05", local_cluster), ("24.11", local_cluster_2411)):
        row = table.setdefault(release, {})
        row["job script"] = _test_only(cluster, ["sbatch", "--test-only", str(script)], folder)
        for name, argv in srun_lines.items():
            row[f"srun {name}"] = _test_only(cluster, [argv[0], "--test-only", *argv[1:]], folder)
        for form in FORMS:
            row[form] = _test_only(cluster, ["sbatch", "--test-only", "-N2", form, "--wrap=true"], folder)
    for what in table["22.05"]:
        print(f"{what:24} {FORMS.get(what, 'ours'):52} " + "  ".join(
            f"{release}: {'accepted' if table[release][what][0] else 'REFUSED: ' + table[release][what][1]}" for release in table
        ))  # fmt: skip
    for release, row in table.items():
        refused = {what: said for what, (ok, said) in row.items() if not ok and FORMS.get(what, "ours").startswith("ours")}
        assert not refused, f"SLURM {release} refuses what we submit: {refused}"
    # What the table in docs/slurm.md says differs: 24.11 refuses the R: flag here, 22.05 takes it.
    assert table["22.05"]["--signal=R:USR1@60"][0] and not table["24.11"]["--signal=R:USR1@60"][0]
    # An exclude list that leaves the partition too few nodes: both refuse the job at once with the
    # words controller/refusal.py acts on (a job that merely waits for nodes would be queued).
    _refused_for_nodes(folder, {"22.05": local_cluster, "24.11": local_cluster_2411})


def _refused_for_nodes(folder: Path, clusters: dict) -> None:
    from orchestrator.slurm.base import NodeConfigUnavailable, SubmitRequest
    from orchestrator.slurm.real import SlurmScheduler

    two = folder / "two-nodes.sbatch"
    two.write_text("#!/bin/sh\n#SBATCH --nodes=2\n#SBATCH --time=1\ntrue\n")
    for release, cluster in clusters.items():
        scheduler = SlurmScheduler(env=cluster.slurm_env())
        all_but_one = sorted(scheduler.nodes())[1:]
        try:
            job = scheduler.submit(SubmitRequest(two, "refusal-check", exclude=all_but_one))
        except NodeConfigUnavailable as refused:
            assert "Requested node configuration is not available" in str(refused), release
            continue
        scheduler.cancel([job])
        pytest.fail(f"SLURM {release} queued job {job} that excludes {all_but_one}: no refusal to act on")
