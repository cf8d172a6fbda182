"""The libfabric environment a multi-node job gets on a node with EFA devices (docs/PROVIDERS.md,
"AWS fast fabric").

NCCL reaches EFA through the aws-ofi-nccl plugin, which opens libfabric; `FI_PROVIDER=efa` pins
libfabric to the EFA provider, so a missing or broken EFA stack fails loudly instead of NCCL
settling on TCP sockets unnoticed [EC2 User Guide, "Get started with EFA and NCCL"]. Nothing else
is forced: `NCCL_SOCKET_IFNAME` stays unset (NCCL picks the ENA interface for its bootstrap) and
`FI_EFA_USE_DEVICE_RDMA` is left to libfabric, which uses the device's RDMA read where the EFA
device reports it (p4d and later) and would abort where a forced 1 meets a device without it.
The job's own `env` wins over all of it; a `container:` job gets none of it (steps.py: the
engine is given no /dev/infiniband). Stdlib only, Python >= 3.8.
"""

import os
from typing import Dict, List

SYS_INFINIBAND = "/sys/class/infiniband"


def efa_devices(root: str = SYS_INFINIBAND) -> List[str]:
    """The RDMA devices the kernel's efa driver serves (rdmap* on EC2), sorted."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    found = []
    for name in names:
        driver = os.path.join(root, name, "device", "driver")
        if os.path.basename(os.path.realpath(driver)) == "efa":
            found.append(name)
    return found


def fabric_env(num_nodes: int, root: str = SYS_INFINIBAND) -> Dict[str, str]:
    """FI_PROVIDER=efa for a multi-node job on a node with EFA devices; else nothing."""
    if num_nodes < 2 or not efa_devices(root):
        return {}
    return {"FI_PROVIDER": "efa"}
