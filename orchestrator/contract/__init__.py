"""The run-directory contract between the controller (login node), the job launcher and the
trainer (SLURM tasks). Everything they say to each other is a file under one run directory on
the shared filesystem; this package is the only place that knows the names, the records and how
each is written and read. Imported by every side, so it stays stdlib-only (no torch, no pydantic).

    <run_dir>/
      run.yaml                     frozen config of this run                      controller
      state.json                   controller state                               controller
      events.jsonl                 what the controller saw and did (events)       controller
      audit.jsonl                  operator actions (append-only)                 controller
      controller.json              the controller's own heartbeat                 controller
      excluded-nodes.json          nodes kept out of later jobs (group reads)      controller
      .private/                    owner-only (0700): the exclude list's lock     controller
      jobs/<job_id>/               rendered sbatch script, job output             controller, job
      jobs/<job_id>/allocation.json  the launcher's nodes, launches, how each ended (allocation)
      jobs/<job_id>/decisions/     the controller's decision after a failed launch (allocation)
      jobs/<job_id>/health/        per-node health-check results before the first launch
      jobs/submissions.jsonl       one line per submitted job (the ledger)
      jobs/last_seen.json          last state seen from the scheduler, per job
      heartbeats/rank-NNNNN.json   one per rank (heartbeat)                       trainer
      control/                     operator requests: kill, resume, nodes-clear (group-writable
                                   drop box; untrusted)
      accepted/                    requests the controller authenticated (requests); the trainer
                                   acts on these, never on control/ directly
      accepted/rollback            the rollback directive, applied once (directive)       controller
      checkpoints/step_NNNNNNN/    one checkpoint, MANIFEST.json written last (manifest)
      checkpoints/step_N/trainer_state.json  its counters and rollback bookkeeping (directive)
      checkpoints/step_N/probe.json what the saved model computes on the probe batch     trainer
      checkpoints/latest           name of the newest complete checkpoint
      checkpoints/damaged.jsonl    checkpoints skipped at resume because they did not verify
                                   (checkpoints/ is `checkpoint.dir` of the config when set)
      metrics.jsonl                one line per training step (metrics)            trainer
      data_cache/                  index files of the data pipeline                trainer
      logs/samples-dp<d>.jsonl     the sample positions each step read (TRAINER_SAMPLE_LOG=1)
      reports/replay-step_N-kK.json  what an SDC replay found (trainer.replay)          aux job

Modules: codes (exit codes, phases, job, launcher states, outcomes), paths (RunPaths), files
(atomic writes; the one bounded reader of untrusted files), heartbeat, events (and by subject:
failure_events, health_events, pool_events), requests, allocation, job_end (srun's report,
parsed once), manifest, metrics, directive (rollbacks). The ranks' side, what any training loop
writes and reads here (beat, marks, the agreed stop, the checkpoint seal, the resume point, exit
codes), is the package `client` (docs/own_training_loop.md); our trainer uses it too. Every record is a typed, versioned
dataclass with one writer and one reader; a newer version is a ContractVersionError.
"""

from .allocation import Allocation, Decision, read_allocation, read_decision, write_allocation, write_decision
from .codes import (
    PURPOSEFUL_EXITS,
    TERMINAL_JOB_STATES,
    ExitCode,
    JobState,
    LauncherState,
    Mark,
    Outcome,
    Phase,
    classify_end,
)
from .directive import (
    CheckpointState,
    DirectiveError,
    Rollback,
    RollbackAsk,
    new_directive_id,
    read_checkpoint_state,
    read_rollback,
    write_rollback,
)
from .exclusions import Exclusion
from .files import (
    ContractError,
    ContractVersionError,
    UntrustedFileError,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    fsync_dir,
    loads_bounded,
    read_json,
    read_jsonl,
    read_owned_json,
    read_untrusted,
    read_untrusted_json,
)
from .heartbeat import Heartbeat, HeartbeatReader, NodeBeat, read_heartbeats, write_heartbeat, write_node_beat
from .job_end import LaunchEnd
from .manifest import (
    Manifest,
    complete_checkpoints,
    damaged_names,
    prune_checkpoints,
    read_latest,
    read_manifest,
    resume_candidates,
    sha256_file,
    verify_manifest,
    write_latest,
)
from .metrics import StepMetrics, read_metrics, tail_metrics
from .paths import (
    CHECKPOINT_NAME_FORMAT,
    CHECKPOINT_STATE_NAME,
    DAMAGED_LOG_NAME,
    DUMP_STACKS_REQUEST,
    KILL_REQUEST,
    LATEST_NAME,
    MANIFEST_NAME,
    NODES_CLEAR_REQUEST,
    PROBE_NAME,
    RESUME_REQUEST,
    ROLLBACK_REQUEST,
    RunPaths,
    checkpoints_dir,
    step_of,
)
from .requests import OperatorRequest, RequestBody

__all__ = [
    "CHECKPOINT_NAME_FORMAT",
    "CHECKPOINT_STATE_NAME",
    "DAMAGED_LOG_NAME",
    "DUMP_STACKS_REQUEST",
    "KILL_REQUEST",
    "LATEST_NAME",
    "MANIFEST_NAME",
    "NODES_CLEAR_REQUEST",
    "PROBE_NAME",
    "PURPOSEFUL_EXITS",
    "RESUME_REQUEST",
    "ROLLBACK_REQUEST",
    "TERMINAL_JOB_STATES",
    "Allocation",
    "CheckpointState",
    "ContractError",
    "ContractVersionError",
    "Decision",
    "DirectiveError",
    "Exclusion",
    "ExitCode",
    "Heartbeat",
    "JobState",
    "LaunchEnd",
    "LauncherState",
    "Manifest",
    "OperatorRequest",
    "Outcome",
    "Phase",
    "RequestBody",
    "Rollback",
    "RollbackAsk",
    "RunPaths",
    "StepMetrics",
    "UntrustedFileError",
    "append_jsonl",
    "atomic_write_json",
    "atomic_write_text",
    "checkpoints_dir",
    "classify_end",
    "fsync_dir",
    "loads_bounded",
    "new_directive_id",
    "read_allocation",
    "read_checkpoint_state",
    "read_decision",
    "read_heartbeats",
    "write_heartbeat",
    "write_node_beat",
    "HeartbeatReader",
    "NodeBeat",
    "Mark",
    "read_json",
    "read_jsonl",
    "read_latest",
    "write_latest",
    "complete_checkpoints",
    "damaged_names",
    "prune_checkpoints",
    "read_manifest",
    "read_metrics",
    "read_owned_json",
    "read_rollback",
    "read_untrusted",
    "read_untrusted_json",
    "resume_candidates",
    "sha256_file",
    "step_of",
    "tail_metrics",
    "verify_manifest",
    "write_allocation",
    "write_decision",
    "write_rollback",
]
