"""gpucloud: declarative GPU training jobs on AWS, Azure or this machine."""

__version__ = "0.1.0"
