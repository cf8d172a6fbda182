"""A fake clock and a fake channel for the agent's unit tests: no sleeps, no processes, no network.

FakeClock advances only when the agent waits or sleeps. FakeTransfer is the agent's Transfer over
an in-memory store keyed by URL, with faults to inject (refused or failing PUTs, missing objects)
and a record of every call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpucloud.vm.agent.clock import Clock
from gpucloud.vm.agent.transfer import Transfer


@dataclass
class FakeClock(Clock):
    t: float = 1_800_000_000.0
    sleeps: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        with self.lock:
            return self.t

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.t += seconds

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if event.is_set():
            return True
        self.advance(max(seconds, 0.001))
        return event.is_set()

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)


class FakeTransfer(Transfer):
    """URL -> bytes. `fail_puts`: that many PUT attempts fail first (each try counts);
    `refuse`: URLs that always fail; every call is recorded in `calls`."""

    def __init__(self, sleep=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(sleep=sleep)
        self.store: dict[str, bytes] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_puts = 0
        self.refuse: set[str] = set()
        self.appended: dict[str, list[tuple[int | None, bytes]]] = {}
        self.requests: dict[tuple[str, str], bytes | None] = {}
        self.lock = threading.Lock()

    def _failing(self, url: str) -> bool:
        with self.lock:
            if url in self.refuse:
                return True
            if self.fail_puts > 0:
                self.fail_puts -= 1
                return True
            return False

    def get(self, url: str, *, max_time: float = 30, limit: int | None = None) -> bytes | None:
        self.calls.append(("get", url))
        if url in self.refuse:
            return None
        data = self.store.get(url)
        if data is not None and limit is not None and len(data) > limit:
            return None
        return data

    def get_file(self, url: str, dest: Path, *, max_time: float = 1800, retries: int = 0) -> bool:
        data = self.get(url)
        if data is None:
            return False
        Path(dest).write_bytes(data)
        return True

    def put_file(self, url: str, path: Path, *, max_time: float = 30, hard: bool = False) -> bool:
        def once() -> bool:
            self.calls.append(("put", url))
            if not url or self._failing(url):
                return False
            self.store[url] = Path(path).read_bytes()
            return True

        return self._hard(once, hard)

    def post_form(self, url, fields, key, path, *, max_time=30, hard=False) -> bool:  # type: ignore[no-untyped-def]
        def once() -> bool:
            self.calls.append(("post", key))
            if self._failing(url):
                return False
            self.store[f"{url}#{key}"] = Path(path).read_bytes()
            return True

        return self._hard(once, hard)

    def append_block(self, url, path, offset, *, max_time=30, hard=False) -> bool:  # type: ignore[no-untyped-def]
        def once() -> bool:
            self.calls.append(("append", f"{url}@{offset}"))
            if self._failing(url):
                return False
            blocks = self.appended.setdefault(url, [])
            if offset is not None and any(o == offset for o, _ in blocks):
                return True  # 412: this part landed before
            blocks.append((offset, Path(path).read_bytes()))
            return True

        return self._hard(once, hard)

    def request(self, method: str, url: str, headers: object = (), *, max_time: float = 20) -> bytes | None:
        self.calls.append((method, url))
        return self.requests.get((method, url))
