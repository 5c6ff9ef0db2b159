"""Login-node side of the toolkit: plans a run, submits it to SLURM, supervises it, shows it.

Seven rooms in layers; a room imports only the rooms below it (tests/unit/test_rooms.py):

    cli          parse, call, print
    controller   one pass: observe, detect, decide, apply; notifications
    views        what a person reads (never the controller's internals)
    operate      what an operator does to a run
    slurm        schedulers, rendering, the job launcher, the local cluster
    plan         config, planner, time budget, pre-flight
    contract     every run-directory record and its one reader/writer

- plan/: the run's config (schema, load, rules), the planner, the time budget, the pre-flight.
- contract/: every run-directory record and its one reader/writer (heartbeats, events, state,
  manifests, exclusions, the controller lock, operators and their rights, file modes), plus the
  training-health judgement that the controller and the views must make identically.
- slurm/: the schedulers (real, mocked), sbatch rendering, node queries, the job launcher, the
  local cluster.
- controller/: one pass: observe, detect, decide, apply; notifications.
- views/: what a person reads: status, dashboard, doctor, metrics for Prometheus, reports,
  goodput, the health report and plot, events as sentences.
- operate/: what an operator does to a run: prepare and submit it, auxiliary jobs.
- cli/: `runctl`: parse, call a room, print.

Never imports torch, deepspeed or triton: `runctl` must start in well under a second on a login node.
"""

# The package's one version number (setup.cfg reads it: `version = attr: orchestrator.__version__`).
__version__ = "0.1.0"
