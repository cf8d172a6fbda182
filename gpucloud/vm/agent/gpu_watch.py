"""The agent's GPU sampling thread: `nvidia-smi` every `gpu_sample_s` seconds folded into the
summary gpu_usage.py keeps, which rides on every status document as `gpu`; when every GPU has been
idle for `idle_timeout` seconds the run is ended through `on_idle` (exit 125), so a hung job stops
billing.

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import threading
from typing import Callable, List, Optional

from gpucloud.vm.agent import gpu_usage
from gpucloud.vm.agent.clock import Clock
from gpucloud.vm.agent.ending import Ending, StandDown
from gpucloud.vm.agent.status import StatusBoard

Sampler = Callable[[], List[gpu_usage.Gpu]]


def idle_message(usage: gpu_usage.Usage, idle_timeout: float) -> str:
    return (
        f"every GPU was idle (under {gpu_usage.IDLE_PCT:g} % utilisation) for {usage.streak_s:.0f} s, "
        f"past resources.idle_timeout {idle_timeout:g} s: the job was stopped so that it stops billing"
    )


class GpuWatch:
    """Samples until `stop` is set; `step` is one sample (the unit tests drive it with a fake clock)."""

    def __init__(
        self,
        board: StatusBoard,
        interval: float,
        idle_timeout: float,
        now: Callable[[], float],
        on_idle: Callable[[str], None],
        sample: Optional[Sampler] = None,
    ) -> None:
        self.board = board
        self.usage = gpu_usage.Usage(max(interval, 0.2), idle_timeout)
        self.idle_timeout = idle_timeout
        self._now = now
        self._on_idle = on_idle
        self._sample = sample or gpu_usage.sample
        self.stop = threading.Event()

    def step(self) -> bool:
        """One sample; False once the idle timeout has ended the run (no more sampling)."""
        self.usage.add(self._sample(), self._now())
        if self.usage.samples:
            self.board.set(gpu=self.usage.as_json())
        if self.usage.idle_expired:
            self._on_idle(idle_message(self.usage, self.idle_timeout))
            return False
        return True

    def loop(self, wait: Callable[[threading.Event, float], object], ended: Callable[[], bool]) -> None:
        """Until the run ends (whoever ends it) or `stop` is set."""
        while not self.stop.is_set() and not ended():
            if not self.step():
                return
            wait(self.stop, self.usage.interval)


class GpuWatching(Ending):
    """The agent's part: the sampling thread beside the job, and the end of a run whose GPUs idle."""

    clock: Clock

    def _thread(self, name: str, target: Callable[[], None]) -> None:
        raise NotImplementedError

    def start_gpu_watch(self) -> Optional[GpuWatch]:
        if self.cfg.gpu_sample_s <= 0:
            return None
        watch = GpuWatch(self.board, self.cfg.gpu_sample_s, self.cfg.idle_timeout, self.clock.now, self.gpus_idle)
        self._thread("gpu", lambda: watch.loop(self.clock.wait, self.gate.taken))
        return watch

    def gpus_idle(self, message: str) -> None:
        """The job's GPUs sat idle past resources.idle_timeout: stop it and report `failed`, 125."""
        if not self.gate.take("gpu"):
            raise StandDown()
        self.log("GPUs idle past resources.idle_timeout: stopping the job")
        self.runner.kill()
        self.finish("failed", 125, 125, message)
        raise StandDown()
