"""Login-node side of the toolkit: config, planner, sbatch rendering, SLURM backends, controller, CLI.

Never imports torch, deepspeed or triton: `runctl` must start in well under a second on a login node.
"""
