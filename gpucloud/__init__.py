"""gpucloud: declarative GPU training jobs on AWS, Azure, your own machines (SSH), Slurm or this machine."""

__version__ = "0.1.0"
