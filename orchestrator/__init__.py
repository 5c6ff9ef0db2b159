"""Login-node side of the toolkit: config, planner, sbatch rendering, SLURM backends, controller, CLI.

Never imports torch, deepspeed or triton: `runctl` must start in well under a second on a login node.
"""

# The package's one version number (setup.cfg reads it: `version = attr: orchestrator.__version__`).
__version__ = "0.1.0"
