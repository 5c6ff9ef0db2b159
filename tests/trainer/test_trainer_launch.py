"""SLURM / torchrun / bare environments -> the rank layout."""

from __future__ import annotations

import pytest

from trainer.launch import dist_env_from


def test_slurm_variables():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NNODES": "4",
           "SLURM_JOB_ID": "4242", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "RANK": "0"}
    d = dist_env_from(env)
    assert (d.rank, d.world_size, d.local_rank, d.nnodes, d.source) == (5, 8, 1, 4, "slurm")
    assert (d.master_addr, d.master_port, d.job_id) == ("10.0.0.1", 29500, "4242")


def test_slurm_multi_task_needs_master_addr():
    with pytest.raises(RuntimeError, match="MASTER_ADDR/MASTER_PORT"):
        dist_env_from({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})


def test_torchrun_variables():
    d = dist_env_from({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1234"})
    assert (d.rank, d.world_size, d.local_rank, d.source, d.master_port) == (1, 2, 1, "torchrun", 1234)


def test_single_process_without_variables():
    d = dist_env_from({})
    assert (d.rank, d.world_size, d.source, d.master_addr) == (0, 1, "single", "127.0.0.1")
    assert d.master_port > 0


def test_bad_integer_is_named():
    with pytest.raises(RuntimeError, match="SLURM_PROCID='x'"):
        dist_env_from({"SLURM_PROCID": "x", "SLURM_NTASKS": "1"})


def test_world_size_mismatch_is_a_config_error(tmp_path):
    """run.yaml says 2 GPUs (dp=2) but one process starts: CONFIG_ERROR (19), never a restart loop."""
    from orchestrator.contract import ExitCode
    from tests.trainer import launch_local
    from tests.trainer.runs import make_run_dir

    run = make_run_dir(tmp_path / "run", cluster={"gpus_per_node": 2})
    assert launch_local.run(run, 1, timeout=180) == [ExitCode.CONFIG_ERROR]
    log = launch_local.read_log(run)
    assert "config refused" in log and "world" in log.lower(), log[-2000:]
    print(log.strip().splitlines()[-1])
