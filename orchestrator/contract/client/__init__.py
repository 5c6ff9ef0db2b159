"""The client side of the run-directory contract: what any training loop calls so that the
controller supervises it as it supervises our own trainer (which uses these same modules).

    from orchestrator.contract import client as runctl

    run = runctl.start()                    # rank, job and run dir from the environment; beat on
    point = run.resume_point()              # which checkpoint, the rollback's skips and LR scale
    ...                                     # the loop's marks: runctl.mark(runctl.Mark.FORWARD),
    with runctl.waiting(): all_reduce(...)  #   runctl.waiting() around collectives
    run.step_done(step, consumed_samples, loss)
    if run.should_stop():                   # kill switch / pre-timeout signal, agreed by all ranks
        save(run.checkpoint_dir(step)); run.checkpoint_saved(step)
        run.exit(run.stop_code())           # the contract's exit codes (ExitCode)

One file per job: ranks (which rank, from SLURM's or torchrun's variables), settings (run.yaml's
few values), beat and node_beats (liveness and progress), progress (marks), stop (the agreed
stop), checkpoints (manifest, `latest`, keep-last), rollback and skips (a directive's effect),
resume_point, exits, supervision (the facade). No torch at import: the client imports in well
under 0.1 s; torch.distributed is used only when the loop passes no all-reduce of its own.
"""

from orchestrator.contract import ExitCode, Mark, Phase

from .progress import mark, waited, waiting
from .resume_point import ResumePoint
from .supervision import RUN_DIR_VARIABLE, Supervision, start

__all__ = [
    "RUN_DIR_VARIABLE",
    "ExitCode",
    "Mark",
    "Phase",
    "ResumePoint",
    "Supervision",
    "mark",
    "start",
    "waited",
    "waiting",
]
