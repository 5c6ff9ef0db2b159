"""The client of the run-directory contract without SLURM: it imports fast and without torch, the
docs' example is the file that runs, and `cluster.command` reaches the job script, the launcher
and the probe job as argv words."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from orchestrator.contract import ExitCode, Rollback, RunPaths, read_checkpoint_state, write_rollback
from orchestrator.contract.requests import OperatorRequest, publish_request
from orchestrator.operate.runs import prepare_run_dir
from orchestrator.slurm.env_probe import probe_argv
from orchestrator.slurm.launcher.node_ranks import node_environment
from orchestrator.slurm.render import render_sbatch, srun_preview

from .config import HERE, REPO, loop_config

EXAMPLE = HERE / "minimal_loop.py"
HEAVY = {"torch", "numpy", "pydantic", "yaml", "jinja2", "rich", "apprise", "deepspeed"}


def test_the_client_imports_without_torch_or_any_heavy_package():
    """What keeps the import light (62-64 ms of CPU here, printed): none of the heavy packages a
    training loop may not want at import. The figure itself is a benchmark's, not this test's."""
    probe = ("import sys, time; w, c = time.perf_counter(), time.process_time(); "
             "import orchestrator.contract.client; "
             "print(time.perf_counter() - w, time.process_time() - c, "
             f"sorted(m for m in {sorted(HEAVY)!r} if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
            .stdout.split(maxsplit=2) for _ in range(3)]
    wall, cpu = (min(float(r[i]) for r in runs) for i in (0, 1))
    print(f"import orchestrator.contract.client: {cpu * 1000:.1f} ms CPU, {wall * 1000:.1f} ms wall (best of 3)")
    assert all(r[2].strip() == "[]" for r in runs), f"heavy packages imported: {runs[0][2]}"


def test_the_docs_example_is_the_file_this_test_runs():
    page = (REPO / "docs" / "own_training_loop.md").read_text()
    blocks = re.findall(r"```python\n# tests/foreign_loops/minimal_loop.py\n(.*?)```", page, re.S)
    assert blocks == [EXAMPLE.read_text()], "paste tests/foreign_loops/minimal_loop.py into the page again"
    assert len(EXAMPLE.read_text().splitlines()) <= 40


def run_example(run: Path, job: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RUNCTL_RUN_DIR": str(run), "PYTHONPATH": str(REPO), "TRAINER_JOB_ID": job}
    for name in ("SLURM_PROCID", "RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    return subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, env=env, timeout=120)


def test_the_example_saves_by_the_contract_stops_on_the_kill_switch_resumes_and_rolls_back(tmp_path):
    run = tmp_path / "run"
    paths = prepare_run_dir(loop_config([sys.executable, str(EXAMPLE)], nodes=1), run)
    # The kill switch, as the controller publishes it once it authenticated an operator's request.
    publish_request(paths, OperatorRequest("kill", "oncall", os.getuid(), "test", False, 0.0))
    killed = run_example(run, "1")
    assert killed.returncode == int(ExitCode.KILLED), killed.stderr[-2000:]
    assert (paths.checkpoints / "latest").read_text().strip() == "step_0000001", "saved, then stopped"
    manifest = json.loads((paths.checkpoints / "step_0000001" / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == {"state.pt", "trainer_state.json"}
    paths.accepted_request("kill").unlink()
    finished = run_example(run, "2")
    assert finished.returncode == int(ExitCode.FINISHED), finished.stderr[-2000:]
    assert "resuming from step_0000001" in finished.stderr
    beat = json.loads((paths.heartbeats / "rank-00000.json").read_text())
    assert (beat["exit_code"], beat["resumed_from"], beat["step"], beat["phase"]) == (0, 1, 20, "exiting")
    steps = [json.loads(line)["step"] for line in paths.metrics.read_text().splitlines()]
    assert steps == list(range(1, 21)), "metrics.jsonl: one line a step, rank 0"

    # A rollback directive (as the controller writes it): back to step 10, samples 100-115 skipped.
    write_rollback(paths, Rollback("rb-0123456789abcdef", 10, ((100, 116),), 0.5, 3, "test", "oncall", 1.0))
    rolled = run_example(run, "3")
    assert rolled.returncode == int(ExitCode.FINISHED), rolled.stderr[-2000:]
    assert "resuming from step_0000010" in rolled.stderr and "rollback rb-0123456789abcdef applied" in rolled.stderr
    beat = json.loads((paths.heartbeats / "rank-00000.json").read_text())
    assert (beat["resumed_from"], beat["rollback_applied"]) == (10, "rb-0123456789abcdef")
    state = read_checkpoint_state(paths.checkpoints / "step_0000020")
    print(f"after the rollback: {state}")
    assert state.applied_directives == ("rb-0123456789abcdef",) and state.skip_samples == ((100, 116),)
    assert state.consumed_samples == 176, "80 after step 10, 10 steps of 8 kept samples, 16 skipped"
    assert (state.lr_scale, state.lr_scale_last_step) == (0.5, 13)


def test_cluster_command_runs_on_every_rank_with_the_launcher_and_no_standby(tmp_path):
    command = [sys.executable, str(HERE / "plain_ddp.py"), "--name", "it's $(rm -rf ~)"]
    cfg = loop_config(command, nodes=2, spare_nodes=1)
    run = str(tmp_path / "run")
    script = render_sbatch(cfg, run)
    launcher = next(line for line in script.splitlines() if line.startswith("exec "))
    assert launcher.endswith("-- " + " ".join([sys.executable, str(HERE / "plain_ddp.py"), "--name",
                                               "'it'\"'\"'s $(rm -rf ~)'"])), launcher
    assert f"--python {sys.executable}" in launcher and "--tasks-per-node 1" in launcher
    lines = srun_preview(cfg, run, command)
    assert not [line for line in lines if "trainer.standby" in line], "no warm standby for another loop"
    assert any("trainer.health" in line for line in lines) and lines[-1].endswith("'it'\"'\"'s $(rm -rf ~)'")


def test_command_per_node_runs_one_task_a_node_behind_torchruns_variables(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", str(HERE / "plain_ddp.py")]
    cfg = loop_config(torchrun, nodes=2, gpus_per_node=2, command_per="node")
    launcher = next(line for line in render_sbatch(cfg, str(tmp_path / "run")).splitlines() if line.startswith("exec "))
    assert "--tasks-per-node 1 --cpus-per-task 2" in launcher, "one task a node, with the CPUs of its 2 ranks"
    assert f"-m orchestrator.slurm.launcher.node_ranks --ranks-per-node 2 -- {' '.join(torchrun)}" in launcher
    env = node_environment({"SLURM_NNODES": "2", "SLURM_NODEID": "1", "MASTER_ADDR": "10.0.0.1",
                            "MASTER_PORT": "12345", "PET_NPROC_PER_NODE": "1"}, 2)
    assert {k: v for k, v in env.items() if k.startswith("PET_")} == {
        "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "10.0.0.1", "PET_MASTER_PORT": "12345",
        "PET_NPROC_PER_NODE": "1",  # what the site set itself wins
    }


def test_the_probe_job_checks_the_client_and_the_program_of_another_loop():
    cfg = loop_config(["/opt/team/bin/train", "--fast"], nodes=1)
    argv = probe_argv(cfg, Path("/tmp/w"))
    assert argv[argv.index("--program") + 1] == "/opt/team/bin/train"
    assert [argv[i + 1] for i, word in enumerate(argv) if word == "--import"] == ["orchestrator.contract.client", "torch"]


def test_a_relative_program_is_refused_with_the_fix():
    import pytest

    from orchestrator.plan.config import ConfigError

    with pytest.raises(ConfigError, match="absolute path or a bare name"):
        loop_config(["bin/train"], nodes=1)


def test_run_paths_of_the_example_are_the_contracts():
    assert RunPaths.of("/r").checkpoints == Path("/r/checkpoints")


def test_the_node_shim_gives_back_the_exit_code_torchrun_turns_into_1(tmp_path):
    from orchestrator.contract.client.beat import HeartbeatWriter
    from orchestrator.slurm.launcher.node_ranks import ranks_exit_code

    paths = RunPaths.of(tmp_path / "run")
    env = {"RUNCTL_RUN_DIR": str(paths.root), "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node07", "RUNCTL_LAUNCH": "0"}

    def ranks_left(*codes: int | None) -> None:
        for rank, code in enumerate(codes):
            beat = HeartbeatWriter(paths, rank, len(codes), "42", 1.0, host="node07")
            paths.heartbeats.mkdir(parents=True, exist_ok=True)
            beat.note(exit_code=code)
            beat.write()

    ranks_left(17, 17)
    assert (ranks_exit_code(1, env), ranks_exit_code(0, env)) == (17, 0), "KILLED, agreed by the node's ranks"
    ranks_left(18, None)
    assert ranks_exit_code(1, env) == 18, "a rank that recorded nothing does not disagree"
    ranks_left(17, 1)
    assert ranks_exit_code(1, env) == 1, "one rank failed: a failure"
    assert ranks_exit_code(1, {**env, "SLURM_JOB_ID": "43"}) == 1, "another job's beats say nothing"


AGREE = """
import os, sys, torch.distributed as dist, torch.multiprocessing as mp
from orchestrator.contract.client.stop import torch_all_reduce_max
def run(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    agreed = torch_all_reduce_max()([rank, 0, 5 - rank])
    open(os.path.join(out, f"rank-{rank}"), "w").write(repr(agreed))
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
"""


def test_the_default_agreement_takes_the_max_over_the_loops_own_process_group(tmp_path):
    """Without a callable of the loop's, the client agrees over torch.distributed's default group,
    through the torch the loop imported (the client never imports torch itself)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = tmp_path / "agree.py"
    script.write_text(AGREE)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(script), port, str(tmp_path)], capture_output=True, text=True,
                         env=env, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    agreed = [(tmp_path / f"rank-{rank}").read_text() for rank in (0, 1)]
    assert agreed == ["[1, 0, 5]", "[1, 0, 5]"], "each rank holds the element-wise MAX of both"
