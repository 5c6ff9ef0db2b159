"""The simulated SLURM asks for what the batch script asks for, as sbatch does: a job submitted
with fewer spares (the pool was short) starts on that many nodes instead of waiting for the full
count, and one that the partition less its exclude list can never hold is refused at once."""

from __future__ import annotations

import random

import pytest

from orchestrator.slurm.base import NodeConfigUnavailable, SubmitRequest
from simulation.clock import VirtualClock
from simulation.slurm import SimSlurm


def _slurm(down: set[str]) -> SimSlurm:
    pool = [f"node{i:02d}" for i in range(1, 7)]
    slurm = SimSlurm(VirtualClock(), pool, nodes_per_job=6, rng=random.Random(0), queue_wait_mean=1.0,
                     slurmd_timeout=300.0, time_limit=3600.0, pre_timeout=0.0)  # fmt: skip
    slurm.down |= down
    return slurm


def _script(tmp_path, nodes: int):
    path = tmp_path / f"train-{nodes}.sbatch"
    path.write_text(f"#!/bin/bash\n#SBATCH --job-name=run\n#SBATCH --nodes={nodes}\nsrun true\n")
    return path


def test_a_job_asking_for_fewer_nodes_starts_on_them(tmp_path):
    slurm = _slurm(down={"node06"})
    job_id = slurm.submit(SubmitRequest(_script(tmp_path, 5), "run"))
    slurm.process(1e6)
    assert slurm.jobs_by_id[job_id].nodes == [f"node{i:02d}" for i in range(1, 6)], "5 of the 5 up nodes"
    full = _slurm(down={"node06"})
    waiting = full.submit(SubmitRequest(_script(tmp_path, 6), "run"))
    full.process(1e6)
    assert full.jobs_by_id[waiting].nodes == [] and full.starved, "6 asked, 5 up: it waits for a repair"


def test_a_job_the_partition_less_its_exclusions_cannot_hold_is_refused(tmp_path):
    slurm = _slurm(down={"node01"})
    assert slurm.submit(SubmitRequest(_script(tmp_path, 5), "run", exclude=["node02"]))  # down counts
    with pytest.raises(NodeConfigUnavailable, match="Requested node configuration is not available"):
        slurm.submit(SubmitRequest(_script(tmp_path, 5), "run", exclude=["node02", "node03"]))
