"""The preemption guard (docs/SPOT.md): beside the job it polls the interruption notice (the
cloud's, through the provider hooks, and the channel's `notice` object that `gpucloud preempt`
writes) and uploads the checkpoint folder every checkpoint interval. Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

from typing import Callable, Optional

from gpucloud.vm import protocol
from gpucloud.vm.agent.checkpoints import Checkpoints
from gpucloud.vm.agent.hooks import Hooks
from gpucloud.vm.agent.transfer import Transfer


class Guard:
    def __init__(
        self,
        notice_url: str,
        transfer: Transfer,
        hooks: Hooks,
        checkpoints: Optional[Checkpoints],
        notice_s: float,
        checkpoint_s: float,
        start: float,
    ) -> None:
        self.notice_url = notice_url
        self.transfer = transfer
        self.hooks = hooks
        self.checkpoints = checkpoints
        self.notice_s = notice_s
        self.checkpoint_s = checkpoint_s
        self.next_notice = 0.0
        self.next_checkpoint = start + checkpoint_s

    def notice(self) -> Optional[str]:
        """Why the node must stop now, or None."""
        if self.notice_url:
            body = self.transfer.get(self.notice_url, max_time=10)
            if body is not None:
                return protocol.notice_reason(body)
        return self.hooks.notice()

    def step(self, now: float, on_notice: Callable[[str], None]) -> None:
        if now >= self.next_notice:
            self.next_notice = now + self.notice_s
            why = self.notice()
            if why is not None:
                on_notice(why)
                return
        if self.checkpoints is not None and now >= self.next_checkpoint:
            self.next_checkpoint = now + self.checkpoint_s
            self.checkpoints.upload("interval")
