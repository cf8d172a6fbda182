"""How the suite is spread over xdist's workers: each test file is one unit of work on one worker,
beside the servers its module starts (a moto, an Azurite, an sshd, a Slurm cluster), except the
many-celled tests named in SPREAD, which go one by one to whichever worker is free. Units go out in
collection order, which tests/conftest.py sorts longest file first.

A scheduler of our own rather than `--dist loadgroup`: that mode marks a group by appending
"@group" to each item's node id, which pytest 9.2 no longer lets a plugin change (its node ids are
derived), so every test was silently sent alone, each file's servers started on every worker."""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

# Tests whose cells are many and independent (each starts from a clean account on the module's
# servers): spread one by one over the workers.
SPREAD = frozenset(
    {
        "test_fault_matrix_provisioning",
        "test_fault_matrix_teardown",
        "test_fault_matrix_leaves_nothing",
        "test_interrupted_or_killed_cli_leaves_nothing",
        "test_gpu_alternatives_plan_through_the_file_as_in_memory",
    }
)


def function_name(nodeid: str) -> str:
    """`tests/x.py::test_y[cell]` -> `test_y` (a class's method: its own name)."""
    return nodeid.split("::")[-1].split("[", 1)[0]


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or itself when it is a SPREAD cell."""
    return nodeid if function_name(nodeid) in SPREAD else nodeid.split("::", 1)[0]


class FileScheduling(LoadScopeScheduling):
    """LoadScopeScheduling with one scope per file (and per SPREAD cell), in collection order."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # the order conftest.py gave (longest first)

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
