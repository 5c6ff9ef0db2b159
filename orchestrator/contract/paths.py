"""Every name in the run directory, once: `RunPaths` and the names of requests and checkpoints.
Nobody else spells a run-directory file name; they ask RunPaths."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# Operator requests in control/ (the file's presence is the request; its body says why).
KILL_REQUEST = "kill"  # graceful: checkpoint, then stop, never restart
DUMP_STACKS_REQUEST = "dump-stacks"  # every rank writes its Python stacks to stacks/
RESUME_REQUEST = "resume"  # undo a kill or a crash-loop stop
NODES_CLEAR_REQUEST = "nodes-clear"  # take repaired nodes off the exclude list (`runctl nodes --clear`)
# control/rollback: an operator's rollback (its body: contract.directive.RollbackAsk); accepted/rollback:
# the directive the controller made of it, or of a health finding (contract.directive.Rollback).
ROLLBACK_REQUEST = "rollback"
FLIGHT_RECORDER_PREFIX = "nccl-trace-"  # stacks/nccl-trace-<job>-rank-<rank>: NCCL flight recorder dumps
CHECKPOINT_NAME_FORMAT = "step_{step:07d}"
CHECKPOINT_DIR_PATTERN = re.compile(r"^step_(\d+)$")
# stacks/rank-NNNNN.txt: one rank's Python stacks. Only these count as answers: a dump being
# written is a hidden .rank-NNNNN.txt.*.tmp beside it, and SIGUSR2 stacks go to rank-N.sigusr2.txt.
STACK_DUMP_PATTERN = re.compile(r"^rank-\d{5}\.txt$")
MANIFEST_NAME = "MANIFEST.json"
CHECKPOINT_STATE_NAME = "trainer_state.json"  # in each step_N/: counters and rollback bookkeeping
PROBE_NAME = "probe.json"  # in each step_N/: what the saved model computes on the probe batch
LATEST_NAME = "latest"
DAMAGED_LOG_NAME = "damaged.jsonl"  # in the checkpoints dir: checkpoints the ranks found damaged
EXCLUDE_FILE_NAME = "excluded-nodes.json"
JOB_SCRIPT_NAME = "job.sbatch"
QUARANTINE_NAME = "quarantine"


def rank_file_name(rank: int) -> str:
    """heartbeats/rank-NNNNN.json: the heartbeat file of a rank alone on its node."""
    return f"rank-{rank:05d}.json"


def step_of(name: str) -> int | None:
    """The step of a checkpoint directory name (step_NNNNNNN), None for anything else."""
    match = CHECKPOINT_DIR_PATTERN.match(name)
    return int(match.group(1)) if match else None


def checkpoints_dir(run_root: Path, configured: str | os.PathLike[str]) -> Path:
    """Where the checkpoints of a run live: `checkpoint.dir` of the config, relative to the run
    directory unless absolute (BLOOM kept them on a scratch filesystem)."""
    configured_path = Path(configured)
    return configured_path if configured_path.is_absolute() else Path(run_root) / configured_path


@dataclass(frozen=True)
class RunPaths:
    """Every path of the contract, derived from the run directory and, for the checkpoints, the
    config's `checkpoint.dir`: build it with `RunPaths.of(run_dir, cfg.checkpoint.dir)` (or
    `RunPaths.for_config(run_dir, cfg)`). Without it the checkpoints are <run_dir>/checkpoints."""

    root: Path
    checkpoints_root: Path | None = None  # None: <root>/checkpoints

    @classmethod
    def of(
        cls, run_dir: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str] | None = None
    ) -> RunPaths:
        root = Path(run_dir).resolve()
        if checkpoint_dir is None:
            return cls(root)
        return cls(root, checkpoints_dir(root, checkpoint_dir))

    @classmethod
    def for_config(cls, run_dir: str | os.PathLike[str], cfg: object) -> RunPaths:
        """The paths of a run with its config (anything with `.checkpoint.dir`)."""
        return cls.of(run_dir, cfg.checkpoint.dir)  # type: ignore[attr-defined]

    # Written by the owner's controller only -------------------------------------------------
    @property
    def config(self) -> Path:
        return self.root / "run.yaml"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def audit(self) -> Path:
        return self.root / "audit.jsonl"

    @property
    def controller_heartbeat(self) -> Path:
        """The controller's own beat, rewritten every pass (`runctl doctor` watches it)."""
        return self.root / "controller.json"

    @property
    def controller_lock(self) -> Path:
        return self.root / "controller.lock"

    @property
    def private(self) -> Path:
        """Owner-only (0700): what nobody else may even open (the exclude list's lock)."""
        return self.root / ".private"

    @property
    def exclude_list(self) -> Path:
        """Nodes the controller excluded (orchestrator.contract.exclude): written by the owner
        only, read by the operators' group; operators clear nodes by a request (NODES_CLEAR_REQUEST)."""
        return self.root / EXCLUDE_FILE_NAME

    @property
    def exclude_lock(self) -> Path:
        return self.private / f".{EXCLUDE_FILE_NAME}.lock"

    # Jobs ----------------------------------------------------------------------------------
    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    def job_output(self, job_id: str | int) -> Path:
        """SLURM's output of the batch script (#SBATCH --output): every rank's lines too."""
        return self.jobs / f"slurm-{job_id}.out"

    @property
    def job_output_pattern(self) -> str:
        """job_output with SLURM's %j for the job id, for the #SBATCH line."""
        return str(self.jobs / "slurm-%j.out")

    def job_dir(self, job_id: str | int) -> Path:
        return self.jobs / str(job_id)

    def job_script(self, job_id: str | int) -> Path:
        return self.job_dir(job_id) / JOB_SCRIPT_NAME

    def allocation(self, job_id: str | int) -> Path:
        """The job launcher's record of its job (contract.allocation)."""
        return self.job_dir(job_id) / "allocation.json"

    def decisions(self, job_id: str | int) -> Path:
        return self.job_dir(job_id) / "decisions"

    def launch_decision(self, job_id: str | int, launch: int) -> Path:
        """The controller's decision about launch `launch` of a job (contract.allocation)."""
        return self.decisions(job_id) / f"launch-{int(launch)}.json"

    def launch_stderr(self, job_id: str | int, launch: int) -> Path:
        """srun's stderr of one launch of the trainer inside a job (which task failed, where)."""
        return self.job_dir(job_id) / f"launch-{int(launch)}.srun.stderr"

    def standby_stderr(self, job_id: str | int, launch: int) -> Path:
        return self.job_dir(job_id) / f"standby-{int(launch)}.srun.stderr"

    def standby_go(self, job_id: str | int, launch: int) -> Path:
        """The launcher's go to the warm standby of launch `launch` (contract.allocation.StandbyGo)."""
        return self.job_dir(job_id) / f"standby-{int(launch)}.go.json"

    def standby_ready(self, job_id: str | int, launch: int) -> Path:
        """One empty file per standby task that has imported everything."""
        return self.job_dir(job_id) / f"standby-{int(launch)}.go.json.ready"

    def health(self, job_id: str | int) -> Path:
        """Per-node results of the health check before launch (trainer/health)."""
        return self.job_dir(job_id) / "health"

    @property
    def submissions(self) -> Path:
        """The submission ledger: one line per submitted job (orchestrator.operate.runs writes it)."""
        return self.jobs / "submissions.jsonl"

    @property
    def last_seen(self) -> Path:
        """The last state seen from the scheduler per job (SLURM forgets ended jobs)."""
        return self.jobs / "last_seen.json"

    # Written by the trainer ------------------------------------------------------------------
    @property
    def heartbeats(self) -> Path:
        return self.root / "heartbeats"

    def heartbeat(self, rank: int) -> Path:
        return self.heartbeats / rank_file_name(rank)

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def logs(self) -> Path:
        """Per-process logs of runs started without SLURM, and the sample logs."""
        return self.root / "logs"

    def sample_log(self, dp_rank: int) -> Path:
        """The sample positions each step read on DP replica `dp_rank` (TRAINER_SAMPLE_LOG=1)."""
        return self.logs / f"samples-dp{dp_rank}.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def data_cache(self) -> Path:
        return self.root / "data_cache"

    @property
    def stacks(self) -> Path:
        return self.root / "stacks"

    def stack_dump(self, rank: int) -> Path:
        return self.stacks / f"rank-{rank:05d}.txt"

    def signal_stack_dump(self, rank: int) -> Path:
        """Where a rank's faulthandler appends its stacks on SIGUSR2 (not an answer to a request)."""
        return self.stacks / f"rank-{rank:05d}.sigusr2.txt"

    def flight_recorder_prefix(self, job_id: str | int) -> Path:
        """Where a GPU job's NCCL flight recorder writes: PyTorch appends the rank to this
        (the job script sets TORCH_NCCL_DEBUG_INFO_TEMP_FILE to it, in stacks/)."""
        return self.stacks / f"{FLIGHT_RECORDER_PREFIX}{job_id}-rank-"

    @property
    def checkpoints(self) -> Path:
        return self.checkpoints_root if self.checkpoints_root is not None else self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / CHECKPOINT_NAME_FORMAT.format(step=step)

    def checkpoint_state(self, step: int) -> Path:
        """step_N/trainer_state.json (contract.directive.CheckpointState)."""
        return self.checkpoint(step) / CHECKPOINT_STATE_NAME

    @property
    def latest(self) -> Path:
        return self.checkpoints / LATEST_NAME

    @property
    def damaged(self) -> Path:
        """Checkpoints found damaged at resume, one JSON line each (skipped, never deleted)."""
        return self.checkpoints / DAMAGED_LOG_NAME

    # Operators --------------------------------------------------------------------------------
    @property
    def control(self) -> Path:
        """Operators' drop box (group-writable; untrusted)."""
        return self.root / "control"

    def control_request(self, name: str) -> Path:
        return self.control / name

    @property
    def accepted(self) -> Path:
        """Requests the controller authenticated, written by the owner only (see control/)."""
        return self.root / "accepted"

    def accepted_request(self, name: str) -> Path:
        return self.accepted / name

    @property
    def rollback_directive(self) -> Path:
        """accepted/rollback: the rollback directive the trainer applies once (contract.directive)."""
        return self.accepted_request(ROLLBACK_REQUEST)

    @property
    def intake_state(self) -> Path:
        """Fingerprints of the requests the controller already handled."""
        return self.accepted / ".intake.json"

    @property
    def quarantine(self) -> Path:
        return self.root / QUARANTINE_NAME

    # Other owner outputs ---------------------------------------------------------------------
    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def replay_report(self, step: int, steps: int) -> Path:
        """What `python -m trainer.replay --step S --steps K` found (the SDC check)."""
        return self.reports / f"replay-{CHECKPOINT_NAME_FORMAT.format(step=step)}-k{steps}.json"

    def replay_log(self, step: int, steps: int, rank: int) -> Path:
        """One replay rank's output, when `runctl sdc-check` started the ranks."""
        return self.reports / f"replay-{CHECKPOINT_NAME_FORMAT.format(step=step)}-k{steps}-rank-{rank}.log"

    @property
    def aux(self) -> Path:
        """Auxiliary jobs (submitit): owner-only."""
        return self.root / "aux"


# Runs under a folder (`runctl ls ROOT`, `runctl metrics ROOT --all`): a folder with a run.yaml,
# at ROOT itself or up to MAX_DEPTH levels below it (e.g. /gpfs/runs/<user>/<run>).
MAX_DEPTH = 2
MAX_RUNS = 1000  # a listing of a huge tree stops here and says so


def find_runs(root: Path) -> tuple[list[Path], bool]:
    """Run directories under `root`, sorted; True when the search stopped at MAX_RUNS."""
    found: list[Path] = []
    frontier = [root]
    for depth in range(MAX_DEPTH + 1):
        below: list[Path] = []
        for folder in frontier:
            if (folder / "run.yaml").is_file():
                found.append(folder)
                if len(found) >= MAX_RUNS:
                    return sorted(found), True
                continue  # a run's own folders (jobs/, checkpoints/) hold no runs
            if depth < MAX_DEPTH:
                try:
                    below += [Path(e.path) for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
                except OSError:
                    continue  # unreadable: another team's runs
        frontier = below
    return sorted(found), False
