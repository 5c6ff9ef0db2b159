"""The job launcher: what every job script execs (`python -m orchestrator.slurm.launcher`).

It never imports torch (it starts in a blink) and runs once per job, on the batch host:
1. makes the job's folder (jobs/<id>/) owner-only, before writing anything in it;
2. the health check (`trainer.health`, one task per allocated node, if enabled): nodes that fail
   it, or do not answer in time, are never used; allocation.json says why;
3. launch 0: the trainer as an srun step on the first N healthy nodes; the rest are spares;
4. when a launch fails in a job with spares, it waits for the controller's decision (the contract's
   allocation records): `relaunch` leaves out the named nodes and starts launch K+1 on spares, in
   this allocation; no decision, or too few spares: the job ends with the launch's exit code and
   the restart is at job level. Without spares (`spare_nodes: 0`) this is the degenerate case:
   one launch, no decision, the job ends with the trainer's code.
The launcher decides nothing itself: which node failed is the controller's call, on the evidence
it records (how each launch ended, parsed once from srun's report: contract.job_end).

Modules: srun_lines (every srun command line, also shown by `runctl submit --dry-run`), steps
(running and killing srun steps), launcher (the job), __main__ (the command line).
"""
