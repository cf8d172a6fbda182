"""Slurm: jobs submitted with sbatch to a cluster's login node (docs/SLURM.md).

Module map (each imports only the ones above it):
- login     the login node (the ssh provider's transport) or this machine (`cluster: local`)
- cluster   partitions, GRES and free GPUs for `plan`; a job's state and queue position; parsing only
- sizing    the CPUs and memory each node asks for, and which nodes can hold them
- batch     sbatch options, the batch script and the per-node wrapper around the VM shim
- channel   SlurmChannel: the file channel on the shared filesystem, plus Slurm's word on the job
- provider  SlurmProvider, composing the above
"""

from gpucloud.providers.slurm.provider import SlurmProvider

__all__ = ["SlurmProvider"]
