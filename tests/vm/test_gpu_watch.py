"""The agent's GPU sampling thread (gpucloud/vm/agent/gpu_watch.py) with a fake clock and a scripted
sampler: every sample lands on the status board as `gpu`, the summary rides on the status document,
and GPUs idle past the timeout end the run once, with the reason."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from gpucloud.vm.agent.gpu_watch import GpuWatch
from gpucloud.vm.agent.status import StatusBoard


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.t += seconds
        return event.is_set()


def board(tmp_path: Path, clock: FakeClock) -> StatusBoard:
    return StatusBoard("r1", 0, tmp_path, clock.now, lambda path, final: True)


def test_samples_ride_on_the_status_document(tmp_path: Path) -> None:
    clock = FakeClock()
    b = board(tmp_path, clock)
    utils = iter([90.0, 80.0, 70.0])
    ended: list[str] = []
    watch = GpuWatch(b, 5.0, 0, clock.now, ended.append, sample=lambda: [[next(utils), 2048.0, 16384.0, 60.0, 50.0]])
    for _ in range(3):
        assert watch.step()
    doc = json.loads(b.document())
    assert doc["gpu"]["samples"] == 3 and doc["gpu"]["mem_peak_mib"] == 2048.0
    assert doc["gpu"]["util_mean"] == 80.0
    assert ended == []  # idle timeout off


def test_idle_gpus_end_the_run_once_within_one_sample(tmp_path: Path) -> None:
    clock = FakeClock()
    b = board(tmp_path, clock)
    ended: list[str] = []
    watch = GpuWatch(b, 5.0, 20, clock.now, ended.append, sample=lambda: [[0.0, 10.0, 16384.0, 30.0, 35.0]])
    start = clock.now()
    watch.loop(clock.wait, lambda: bool(ended))
    assert len(ended) == 1 and "resources.idle_timeout 20 s" in ended[0]
    assert 20 <= clock.now() - start <= 20 + 5


def test_the_thread_stops_when_the_run_ends_elsewhere(tmp_path: Path) -> None:
    clock = FakeClock()
    b = board(tmp_path, clock)
    calls = []

    def sample() -> list[list[float | None]]:
        calls.append(1)
        return [[50.0, 10.0, 16384.0, 30.0, 35.0]]

    watch = GpuWatch(b, 5.0, 0, clock.now, lambda m: None, sample=sample)
    watch.loop(clock.wait, lambda: len(calls) >= 2)
    assert len(calls) == 2
