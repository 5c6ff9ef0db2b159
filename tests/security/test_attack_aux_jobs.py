"""The pickles and scripts of aux jobs (`runctl eval` and the others,
through submitit), attacked by an operator of the team while the owner works under umask 002 in a
setgid team directory.

The SLURM commands are stand-ins on PATH (sbatch answers a job id, squeue does not answer, srun
records what it was asked to run and the umask it ran under); the job itself is the submission
script submitit wrote, run by bash as the owner, then the python step srun was given, run as the
owner in-process (the venv's interpreter is not executable by the test users). Every file is
real, and so are the users: the kernel decides what the operator can do.
"""

from __future__ import annotations

import os
import pickle
import runpy
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import submitit
import submitit.core._submit  # noqa: F401 - imported before any fork
import submitit.core.submission  # noqa: F401
from attack_env import as_user, start_as, uid

import orchestrator.operate.aux_files  # noqa: F401
import orchestrator.operate.auxjobs  # noqa: F401
import orchestrator.slurm.real  # noqa: F401
import trainer.aux_tasks  # noqa: F401
from orchestrator.contract import read_jsonl
from orchestrator.errors import EXIT_FAILURE

submitit.JobEnvironment  # noqa: B018 - the plugin lookup, before any fork


class RunsCode:
    """Unpickling it makes the folder `path`: proof that the pickle ran code, and as whom."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


@pytest.fixture
def fake_slurm():
    """A bin folder with sbatch (prints `Submitted batch job $FAKE_JOB_ID`), squeue (fails: the
    waiting side then keeps polling for the result) and srun (records its arguments and umask in
    $SRUN_RECORD)."""
    folder = Path(tempfile.mkdtemp(prefix="rc-sec-bin-", dir="/tmp"))
    os.chmod(folder, 0o755)
    scripts = {
        "sbatch": 'echo "Submitted batch job $FAKE_JOB_ID"',
        "squeue": "exit 1",
        "srun": 'umask > "$SRUN_RECORD.umask"; printf "%s\\n" "$@" > "$SRUN_RECORD"',
    }
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        os.chmod(folder / name, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def slurm_env(fake_slurm: Path, job_id: str) -> dict[str, str]:
    return {"PATH": f"{fake_slurm}:/usr/bin:/bin", "FAKE_JOB_ID": job_id}


def run_the_job(team, fake_slurm: Path, folder: Path, job_id: str) -> tuple[object, str]:
    """The job, as SLURM runs it: bash runs the submission script as the owner; then the python
    step srun was given runs as the owner, under the umask the script left."""
    record = folder.parent.parent.parent / f"srun-{job_id}"  # the base folder: the owner may write it
    env = {**slurm_env(fake_slurm, job_id), "SRUN_RECORD": str(record), "SLURM_JOB_ID": job_id}
    script = folder / f"{job_id}_submission.sh"
    shell, out = as_user(team.owner, lambda: subprocess.run(["bash", str(script)], env=env).returncode)
    assert shell == 0, out
    argv = record.read_text().splitlines()
    umask = int(Path(f"{record}.umask").read_text(), 8)
    module, job_folder = argv[argv.index("-m") + 1], argv[-1]
    slurm_vars = dict(
        SLURM_JOB_ID=job_id, SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_LOCALID="0", SLURM_NODEID="0",
        SLURM_JOB_NUM_NODES="1", SUBMITIT_EXECUTOR="slurm",
    )  # fmt: skip

    def python_step():
        sys.argv = [module, job_folder]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            return exc.code
        return 0

    return as_user(team.owner, python_step, umask=umask, env=slurm_vars)


def wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def test_operator_cannot_plant_a_pickle_nor_read_the_aux_script(team, shared_run, fake_slurm):
    """Hole 1: the operator replaced *_submitted.pkl and dropped *_result.pkl, and the job (on a
    compute node) and `runctl eval` (on the login node) both ran their code as the owner.
    Hole 8: the operator read the aux script and its exported secrets."""
    paths = shared_run(team_dir=True, cluster={"env": {"WANDB_API_KEY": "s3cret-token"}})
    base = paths.root.parent
    waiting = start_as(
        team.owner, lambda: runctl_as_self(["eval", str(paths.root), "--step", "99"]), umask=0o002,
        env=slurm_env(fake_slurm, "555"),
    )  # fmt: skip
    folder = paths.root / "aux" / "eval-555"
    wait_for(folder / "555_submitted.pkl")

    def attack():
        tried = {}
        for name, what in (
            ("555_submitted.pkl", "replace the job's pickle"),
            ("555_0_result.pkl", "drop a result"),
        ):
            try:
                staged = folder / f".{name}.tmp"
                staged.write_bytes(pickle.dumps(RunsCode(base / f"ran-as-{name}")))
                os.replace(staged, folder / name)
                tried[what] = "done"
            except OSError as exc:
                tried[what] = exc
        try:
            tried["read the script"] = (folder / "555_submission.sh").read_text()
        except OSError as exc:
            tried["read the script"] = exc
        return tried

    tried, out = as_user(team.oncall, attack)
    assert not isinstance(tried, BaseException), out
    time.sleep(0.3)  # the waiting `runctl eval` polls meanwhile: a planted result would be loaded now
    job_exit, job_out = run_the_job(team, fake_slurm, folder, "555")
    cli, cli_log = waiting.result(timeout=30)

    ran = sorted(p.name for p in base.glob("ran-as-*"))
    assert ran == [], f"planted pickles ran as the owner: {ran}\n{job_out}\n{cli_log}"
    assert all(isinstance(v, PermissionError) for v in tried.values()), tried
    rc, cli_out = cli
    # The job ran the real task, its error came back as JSON, and `runctl eval` reported it.
    assert job_exit != 0 and rc == EXIT_FAILURE and "no checkpoint" in cli_out, (job_out, cli_out)
    failed = read_jsonl(paths.events)[-1]
    assert failed["event"] == "aux_failed" and "no checkpoint" in failed["error"], failed
    # Everything under aux/ is the owner's alone (submitit's symlink to the script aside).
    for dirpath, dirnames, filenames in os.walk(paths.root / "aux"):
        for entry in [Path(dirpath), *(Path(dirpath) / n for n in dirnames + filenames)]:
            info = os.lstat(entry)
            if not stat.S_ISLNK(info.st_mode):
                assert stat.S_IMODE(info.st_mode) & 0o077 == 0, f"{entry} is {stat.S_IMODE(info.st_mode):04o}"
                assert info.st_uid == uid(team.owner), entry


def runctl_as_self(argv: list[str]) -> tuple[int, str]:
    """`runctl ARGV` in this (already forked) child, with its output: (exit code, output)."""
    import io  # noqa: PLC0415
    from contextlib import redirect_stderr, redirect_stdout  # noqa: PLC0415

    from orchestrator.cli.main import main  # noqa: PLC0415

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        rc = main(argv)
    return rc, out.getvalue()


def test_the_job_checks_its_folder_before_unpickling(team, shared_run, fake_slurm):
    """Defence in depth, inside the job: whatever made the folder loose, a pickle someone else could
    have written, a symlink or a hard link is refused by the job's own check, never loaded."""
    paths = shared_run(team_dir=True)
    base = paths.root.parent
    aux = paths.root / "aux"
    cases = {
        "symlink": ("603", "symbolic link"),
        "hard link": ("604", "hard links"),
        "another user's pickle": ("605", "belongs to uid"),
        "loose folders, the operator's pickle": ("606", "open to group"),
    }
    for case, (job_id, reason) in cases.items():

        def submit(job_id=job_id):
            kwargs = {"run_dir": str(paths.root), "step": 9}
            return orchestrator.operate.auxjobs.submit_aux(paths.root, "eval", kwargs).job_id

        submitted, out = as_user(team.owner, submit, umask=0o002, env=slurm_env(fake_slurm, job_id))
        assert submitted == job_id, out
        folder = aux / f"eval-{job_id}"
        pkl = folder / f"{job_id}_submitted.pkl"
        evil = pickle.dumps(RunsCode(base / f"ran-{job_id}"))
        if case == "symlink":  # only the owner or root can plant these three in a 0700 folder
            (base / "evil.pkl").write_bytes(evil)
            os.chown(base / "evil.pkl", uid(team.owner), -1)
            pkl.unlink()
            pkl.symlink_to(base / "evil.pkl")
        elif case == "hard link":
            pkl.write_bytes(evil)
            os.link(pkl, base / f"second-name-{job_id}")
        elif case == "another user's pickle":
            pkl.write_bytes(evil)
            os.chown(pkl, uid(team.oncall), -1)
        else:  # as the owner's umask 002 used to leave them: the team may write the job's folder
            for loose in (aux, folder):
                os.chown(loose, -1, os.stat(paths.root).st_gid)
                os.chmod(loose, 0o2770)
            planted, out = as_user(
                team.oncall, lambda pkl=pkl, evil=evil: (pkl.unlink(), pkl.write_bytes(evil))
            )
            assert not isinstance(planted, BaseException), out
        exit_code, out = run_the_job(team, fake_slurm, folder, job_id)
        assert not (base / f"ran-{job_id}").exists(), f"{case}: the pickle was loaded\n{out}"
        assert exit_code == 1 and "refusing to load" in out and reason in out, (case, out)


def test_the_result_is_read_bounded_never_following_links_nor_blocking(team, shared_run, fake_slurm):
    """What `runctl eval` reads back on the login node: JSON through the bounded reader. A FIFO
    (would block), a symlink (would be followed), deep nesting (RecursionError) or an oversized
    file in the result's place is refused with one error, at once."""
    paths = shared_run(team_dir=True)
    secret = paths.root.parent / "id_rsa"
    secret.write_text('{"status": "success", "result": "the owner\'s secret"}')
    os.chown(secret, uid(team.owner), -1)
    plants = {
        "fifo": lambda path: os.mkfifo(path, 0o600),
        "symlink": lambda path: path.symlink_to(secret),
        "deep": lambda path: path.write_text("[" * 100_000 + "]" * 100_000),
        "huge": lambda path: path.write_text('{"status": "success", "result": "' + "x" * (2 << 20) + '"}'),
    }
    for n, (kind, plant) in enumerate(plants.items()):
        job_id = str(700 + n)

        def submit_and_read(plant=plant):
            kwargs = {"run_dir": str(paths.root), "step": 9}
            aux = orchestrator.operate.auxjobs.submit_aux(paths.root, "eval", kwargs)
            plant(orchestrator.operate.aux_files.result_json(aux.job.paths))
            try:
                return orchestrator.operate.aux_files.read_result(aux.job.paths)
            except orchestrator.operate.aux_files.AuxResultError as exc:
                return exc

        refused, out = as_user(team.owner, submit_and_read, timeout=10, env=slurm_env(fake_slurm, job_id))
        assert isinstance(refused, orchestrator.operate.aux_files.AuxResultError), (kind, refused, out)
