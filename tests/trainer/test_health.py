"""Node health checks before launch (`python -m trainer.health`).

Unit tests of each check on real files and a fake `nvidia-smi` on PATH; the attribution rule of
the all-reduce with real processes; and the real command as one srun step over the 4 nodes of
the local SLURM cluster with faulty nodes.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.plan.config import ConfigError, dump_config, parse_config
from orchestrator.plan.config.load import resolve_paths
from tests.trainer.runs import REPO_ROOT, tiny_config_dict
from trainer.health.checks import check_memory, probe_dir, run_site_command
from trainer.health.gpu import check_gpus, parse_nvlink_status, parse_query_gpu

CAPTURED = REPO_ROOT / "tests" / "trainer" / "data" / "nvidia_smi"


def write_run_dir(run_dir: Path, **changes) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = resolve_paths(parse_config(tiny_config_dict(**changes), source="tests"), REPO_ROOT)
    (run_dir / "run.yaml").write_text(dump_config(cfg))
    return run_dir


def health_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MASTER_", "TRAINER_"))}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra)
    return env


def read_result(job_dir: Path, node: str) -> dict:
    return json.loads((job_dir / "health" / f"{node}.json").read_text())


def check_of(result: dict, name: str) -> dict:
    return next(c for c in result["checks"] if c["name"] == name)


# -- directories and memory -----------------------------------------------------------------------
def test_dir_probe_writes_and_cleans_up_refuses_planted_symlink_and_read_only(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    good = probe_dir("checkpoint_dir_writable", run_dir / "ckpt" / "a", run_dir, "node01")
    assert good.ok and good.detail.startswith(str(run_dir / "ckpt" / "a"))
    assert os.listdir(run_dir / "ckpt" / "a") == []  # the probe file is gone

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run_dir / "checkpoints").symlink_to(elsewhere)  # planted in the shared run dir
    planted = probe_dir("checkpoint_dir_writable", run_dir / "checkpoints", run_dir, "node01")
    assert not planted.ok and "symbolic link" in planted.detail
    assert os.listdir(elsewhere) == []  # nothing was written through the link

    if os.geteuid() == 0:
        read_only = Path("/sys")  # sysfs refuses new files even to root (chmod does not stop root)
    else:
        read_only = tmp_path / "ro"
        read_only.mkdir()
        read_only.chmod(stat.S_IRUSR | stat.S_IXUSR)
    refused = probe_dir("scratch_dir_writable", read_only, read_only, "node01")
    assert not refused.ok and "is not writable" in refused.detail and "node" in refused.detail


def test_memory_check_against_real_meminfo_and_a_written_one(tmp_path):
    assert check_memory(0.0).ok
    low = check_memory(10**6)  # a million GiB: no machine has it
    assert not low.ok and "min_free_memory_gib" in low.detail
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       33554432 kB\nMemFree:  1024 kB\nMemAvailable:    3145728 kB\n"
    )  # 3 GiB
    assert check_memory(2.9, meminfo).ok and not check_memory(3.1, meminfo).ok
    assert "3.0 GiB" in check_memory(3.1, meminfo).detail
    assert not check_memory(0.5, meminfo, fail=True).ok


# -- site command ---------------------------------------------------------------------------------
def test_site_command_exit_code_and_sanitised_bounded_reason(tmp_path):
    script = tmp_path / "site-check"
    script.write_text(
        '#!/bin/sh\nif [ "$1" = ok ]; then exit 0; fi\n'
        "head -c 100000 /dev/zero | tr '\\0' x >&2\n"  # a chatty command: 100 kB on stderr
        "printf '\\nIB port mlx5_0 \\033[31mDOWN\\033[0m\\n' >&2\nexit 3\n"
    )
    script.chmod(0o755)
    assert run_site_command([str(script), "ok"], 10, os.environ).ok
    failed = run_site_command([str(script), "bad"], 10, os.environ)
    assert not failed.ok and "exit 3" in failed.detail
    shown = failed.to_dict()["detail"]
    assert "IB port mlx5_0" in shown and "\x1b" not in shown and len(shown) <= 400
    missing = run_site_command([str(tmp_path / "nope")], 10, os.environ)
    assert not missing.ok and "cannot run" in missing.detail


def test_config_section_refuses_shell_strings_and_control_characters():
    assert parse_config(
        tiny_config_dict(health_check={"command": ["/opt/site/check", "--quick"]})
    ).health_check.command
    for bad in ("/opt/site/check --quick", ["bad\narg"], ["./relative"], []):
        with pytest.raises(ConfigError, match="health_check.command"):
            parse_config(tiny_config_dict(health_check={"command": bad}))
    with pytest.raises(ConfigError, match="env.TRAINER_FAULT"):  # a run config cannot turn faults on
        parse_config(tiny_config_dict(cluster={"env": {"TRAINER_FAULT": "health_memory@node01"}}))


def test_health_faults_aim_at_one_node_and_the_trainer_ignores_them():
    from trainer.faults import Fault, health_faults, parse_faults

    text = "health_memory@node03, nan@step5,health_unreachable@node03,health_dir@node01"
    assert parse_faults(text) == [Fault("nan", 5)]
    assert health_faults(text, "node03") == {"health_memory", "health_unreachable"}
    assert health_faults(text, "node02") == set()


# -- GPUs through a fake nvidia-smi on PATH -------------------------------------------------------
def h200_rows(count: int = 8, ecc_errors: dict[int, str] | None = None) -> str:
    ecc_errors = ecc_errors or {}
    return "".join(
        f"{i}, NVIDIA H200, GPU-0000000{i}-1111-2222-3333-444444444444, 00000000:{0x18 + i:02X}:00.0, Enabled, "
        f"{ecc_errors.get(i, '0')}, [N/A], No, No\n"
        for i in range(count)
    )


def nvlink_text(gpus: int = 8, links: int = 18, down: tuple[tuple[int, int], ...] = ()) -> str:
    lines = []
    for g in range(gpus):
        lines.append(f"GPU {g}: NVIDIA H200 (UUID: GPU-0000000{g}-1111-2222-3333-444444444444)")
        lines += [f"\t Link {k}: {'<inactive>' if (g, k) in down else '26.562 GB/s'}" for k in range(links)]
    return "\n".join(lines) + "\n"


def fake_nvidia_smi(tmp_path: Path, query: str, nvlink: str) -> dict[str, str]:
    """A `nvidia-smi` first on PATH that prints the given outputs for the two commands we run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "query.csv").write_text(query)
    (tmp_path / "nvlink.txt").write_text(nvlink)
    script = bin_dir / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\ncase "$1" in\n  --query-gpu=*) cat {tmp_path}/query.csv ;;\n'
        f'  nvlink) cat {tmp_path}/nvlink.txt ;;\n  *) echo unexpected "$@" >&2; exit 2 ;;\nesac\n'
    )
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize(
    ("query", "nvlink", "failed", "words"),
    [
        (h200_rows(), nvlink_text(), [], ""),
        (h200_rows(7), nvlink_text(7), ["gpu_count"], "7 GPU(s) visible"),
        (
            h200_rows(ecc_errors={5: "2"}),
            nvlink_text(),
            ["gpu_memory_errors"],
            "GPU 5 (00000000:1D:00.0): 2 uncorrected",
        ),
        (
            h200_rows(),
            nvlink_text(down=((3, 11),)),
            ["nvlink"],
            "1 of 144 NVLink links inactive (GPU 3 link 11)",
        ),
        (h200_rows(ecc_errors={0: "[GPU is lost]"}), nvlink_text(), ["gpu_memory_errors"], "GPU is lost"),
    ],
    ids=["healthy", "7-of-8", "ecc", "nvlink-down", "gpu-lost"],
)
def test_gpu_checks_through_a_fake_nvidia_smi(tmp_path, query, nvlink, failed, words):
    checks = check_gpus(8, True, fake_nvidia_smi(tmp_path, query, nvlink), timeout=20)
    assert [c.name for c in checks] == ["gpu_count", "gpu_memory_errors", "nvlink"]
    assert [c.name for c in checks if not c.ok] == failed, [c.detail for c in checks]
    assert all(words in c.detail for c in checks if not c.ok)


def test_real_h200_output_captured_on_the_device(tmp_path):
    """Outputs captured from one H200 (driver 580.159.04; tests/trainer/data/nvidia_smi/, exit codes
    in *.rc) through the fake nvidia-smi: the GPU count and identity agree with two other commands
    (`--query-gpu=count`, `-L`), and a healthy card passes (its `-q -d ECC` shows 0 uncorrectable).
    A single GPU has no NVLink (`nvlink --status` prints nothing): not checked for one GPU."""
    captured = {
        name: (CAPTURED / f"{name}.txt").read_text()
        for name in ("query_gpu_health", "query_gpu_count", "list_gpus", "nvlink_status", "q_ecc")
    }
    assert all((CAPTURED / f"{name}.rc").read_text().strip() == "0" for name in captured)
    rows = parse_query_gpu(captured["query_gpu_health"])
    listed = re.findall(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f-]+)\)$", captured["list_gpus"], re.M)
    assert len(rows) == int(captured["query_gpu_count"].strip()) == len(listed) == 1
    assert [(r.values["index"], r.values["name"], r.values["uuid"]) for r in rows] == listed
    assert (
        re.search(r"DRAM Uncorrectable\s+: 0", captured["q_ecc"])
        and rows[0].values["ecc.mode.current"] == "Enabled"
    )
    assert parse_nvlink_status(captured["nvlink_status"]) == {}
    env = fake_nvidia_smi(tmp_path, captured["query_gpu_health"], captured["nvlink_status"])
    checks = check_gpus(1, True, env, timeout=20)
    assert [(c.name, c.ok) for c in checks] == [("gpu_count", True), ("gpu_memory_errors", True)], checks
    assert "1 x NVIDIA H200" in checks[0].detail


def test_parsers_on_not_supported_values_and_every_link_inactive():
    (row,) = parse_query_gpu(
        "0, Tesla V100-SXM2-32GB, GPU-1, 00000000:06:00.0, [N/A], [Not Supported], No, [N/A], [N/A]\n"
    )
    assert row.values["remapped_rows.pending"] == "[N/A]"
    from trainer.health.gpu import gpu_problems, nvlink_check

    assert gpu_problems(row) == []
    assert parse_nvlink_status(nvlink_text(2, 2, down=((0, 1),))) == {
        0: {0: True, 1: False},
        1: {0: True, 1: True},
    }
    fabric_down = nvlink_check(
        parse_nvlink_status(nvlink_text(8, 18, down=tuple((g, k) for g in range(8) for k in range(18))))
    )
    assert not fabric_down.ok and "144 of 144" in fabric_down.detail
    assert not nvlink_check(parse_nvlink_status("")).ok  # 8 GPUs and no NVLink at all: fabric down


def test_exit_codes_bad_node_name_bad_config_planted_health_dir(tmp_path):
    """Exit 0 only when the file is written; a node name unfit for a file name (2), a refused
    run.yaml (19) and a planted health/ symlink (1) write nothing."""
    run_dir = write_run_dir(tmp_path / "run")
    job_dir = run_dir / "jobs" / "9"

    def health(**env: str) -> subprocess.CompletedProcess:
        command = [
            sys.executable,
            "-m",
            "trainer.health",
            "--run-dir",
            str(run_dir),
            "--job-dir",
            str(job_dir),
        ]
        return subprocess.run(
            command, env=health_env(**env), cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
        )

    bad_name = health(SLURMD_NODENAME="../../etc")
    assert bad_name.returncode == 2 and "not a safe file name" in bad_name.stderr
    assert not job_dir.exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job_dir.mkdir(parents=True)
    (job_dir / "health").symlink_to(elsewhere)
    planted = health(SLURMD_NODENAME="node01")
    assert planted.returncode == 1 and "symbolic link" in planted.stderr and os.listdir(elsewhere) == []
    frozen = yaml.safe_load((run_dir / "run.yaml").read_text())
    frozen["health_check"]["min_free_memory_gib"] = -1
    (run_dir / "run.yaml").write_text(yaml.safe_dump(frozen))
    refused = health(SLURMD_NODENAME="node01")
    assert refused.returncode == 19 and "health_check.min_free_memory_gib = -1" in refused.stderr


# -- the all-reduce and its attribution, with real processes --------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_nodes_one_unreachable_blames_nobody(tmp_path):
    """1 of 2 nodes reached the store: rank 0's node or the network may be at fault as much as the
    other node, so neither is marked bad; both files say what went wrong (allocation_problem)."""
    run_dir = write_run_dir(tmp_path / "run", health_check={"timeout_seconds": 30})  # the minimum: CI time
    job_dir = run_dir / "jobs" / "7"
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "trainer.health", "--run-dir", str(run_dir), "--job-dir", str(job_dir)],
            env=health_env(
                SLURM_PROCID=str(rank),
                SLURM_NTASKS="2",
                SLURMD_NODENAME=f"n{rank + 1}",
                SLURM_JOB_ID="7",
                SLURM_STEP_ID="0",
                MASTER_ADDR="127.0.0.1",
                TRAINER_HEALTH_PORT=port,
                TRAINER_FAULT="health_unreachable@n2",
            ),
            cwd=REPO_ROOT,
        )
        for rank in range(2)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    for node in ("n1", "n2"):
        result = read_result(job_dir, node)
        allreduce = check_of(result, "allreduce")
        print(node, result["seconds"], allreduce)
        assert result["ok"] is True and result["reason"] == "", result
        assert allreduce["ok"] is False and allreduce["blames_node"] is False
        assert "1 of 2" in result["allocation_problem"]
    assert result["seconds"] < 40


# -- the real command on the local SLURM cluster --------------------------------------------------
@pytest.mark.slurm
def test_one_srun_step_over_four_nodes_names_the_faulty_ones(local_cluster, tmp_path):
    """node02 fails its memory check; node04 cannot reach the rendezvous store (3 of 4 nodes
    did, so it is named); node01 and node03 are healthy and all-reduce together."""
    run_dir = write_run_dir(
        tmp_path / "run",
        cluster={"nodes": 4, "gpus_per_node": 1},
        parallel={"micro_batch_size": 1, "global_batch_size": 8},
        health_check={"timeout_seconds": 45, "min_free_memory_gib": 0.1},
    )
    job_dir = run_dir / "jobs" / "current"
    env = dict(
        local_cluster.slurm_env(),
        PYTHONPATH=str(REPO_ROOT),
        TRAINER_FAULT="health_memory@node02,health_unreachable@node04",
    )
    env = {k: v for k, v in env.items() if not k.startswith("MASTER_")}
    proc = subprocess.run(
        [
            "srun",
            "--nodes=4",
            "--ntasks-per-node=1",
            "--cpus-per-task=1",
            sys.executable,
            "-m",
            "trainer.health",
            "--run-dir",
            str(run_dir),
            "--job-dir",
            str(job_dir),
        ],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (job_dir / "health").glob("*.json")) == [
        f"node0{i}.json" for i in range(1, 5)
    ]
    results = {node: read_result(job_dir, node) for node in ("node01", "node02", "node03", "node04")}
    for node, result in results.items():
        print(
            node, result["ok"], result["seconds"], result["reason"] or check_of(result, "allreduce")["detail"]
        )
    assert {n for n, r in results.items() if r["ok"]} == {"node01", "node03"}
    assert results["node02"]["reason"].startswith(
        "free_memory: MemAvailable 0.0 GiB < health_check.min_free_memory_gib"
    )
    assert "could not reach the rendezvous store" in results["node04"]["reason"]
    assert "3 of 4 nodes did" in results["node04"]["reason"]
    assert "gloo all-reduce of 1 MiB over 2 node(s)" in check_of(results["node03"], "allreduce")["detail"]
    assert "node04 did not register" in check_of(results["node01"], "allreduce")["detail"]
    assert check_of(results["node02"], "allreduce")["detail"].startswith("skipped")
    assert all("allocation_problem" not in r for r in results.values())
    assert {r["job_id"] for r in results.values()} == {results["node01"]["job_id"]}
