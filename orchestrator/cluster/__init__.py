"""A real SLURM cluster of emulated nodes on this machine (Debian's slurm-wlm 22.05)."""

from .local import ClusterError, ClusterSpec, LocalCluster, default_cluster_dir

__all__ = ["ClusterError", "ClusterSpec", "LocalCluster", "default_cluster_dir"]
