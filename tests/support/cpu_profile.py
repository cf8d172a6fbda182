"""Per-test CPU for bench/suite_profile.py: with GPUCLOUD_TEST_CPU=PREFIX, each test's wall time and the
CPU its worker spent on it (the worker itself, and every child process it reaped meanwhile: the CLI
subprocesses, the simulated nodes) go as JSON lines to PREFIX.<worker>. Servers that outlive a test
(a module's moto, Azurite, sshd) are counted when the fixture that started them reaps them."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from typing import Any

import pytest


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    prefix = os.environ.get("GPUCLOUD_TEST_CPU")
    if not prefix:
        yield
        return
    t0, (own0, kids0) = time.monotonic(), _cpu()
    yield
    own1, kids1 = _cpu()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    row = {"id": item.nodeid, "wall": time.monotonic() - t0, "own": own1 - own0, "kids": kids1 - kids0}
    with open(f"{prefix}.{worker}", "a") as out:
        out.write(json.dumps(row) + "\n")
