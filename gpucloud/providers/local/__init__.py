"""The local provider: this machine, and a VM as a local process group."""
