"""Node health checks before launch: `python -m trainer.health --run-dir RUN_DIR --job-dir JOB_DIR`.

Run by the job's launcher as ONE srun step over the nodes to check, one task per node:

    srun --nodes=N --ntasks-per-node=1 <python> -m trainer.health --run-dir RUN_DIR --job-dir JOB_DIR

(add --gres=gpu:<gpus_per_node> on GPU nodes: with cgroup ConstrainDevices a step without it sees
no GPU; never --kill-on-bad-exit: one node's failure must not stop the others' checks). Each task
checks its own node and writes JOB_DIR/health/<node>.json (write to a temp name, fsync, rename):

    {"node": "node02", "ok": false,
     "reason": "free_memory: MemAvailable 0.0 GiB < ... : find what holds the memory ...",
     "checks": [{"name": "checkpoint_dir_writable", "ok": true, "detail": "..."}, ...],
     "seconds": 1.2, "job_id": "123", "step_id": "0", "rank": 1, "time": 1764500000.0,
     "allocation_problem": "..."}            (only when something failed that blames no node)

`<node>` is SLURMD_NODENAME. A node whose file is missing, or says ok=false, is unhealthy. A check
that failed with "blames_node": false (the all-reduce that nobody could be blamed for) does not
make ok false; `allocation_problem` then says what went wrong, in every file that could say it.

Checks, in order (trainer.health.checks, .gpu, .rendezvous):
    run_dir_writable, checkpoint_dir_writable, scratch_dir_writable
                      create + fsync + remove a small file; no symlink under the run dir followed
    free_memory       MemAvailable >= health_check.min_free_memory_gib
    gpu_count, gpu_memory_errors, nvlink     (cluster.accelerator cuda only) via nvidia-smi
    site_command      instead of all of the above when health_check.command is set
    allreduce         across every task of the step, with attribution of a node that cannot join
                      (its store's keys under a secret token in JOB_DIR/health/, 0700: secret.py)

Exit codes: 0 the check ran and its file is written (whatever it found); 2 bad arguments or a node
name unfit for a file name; 19 (ExitCode.CONFIG_ERROR) run.yaml refused; 1 anything else that
kept the checker from writing its file.
"""
