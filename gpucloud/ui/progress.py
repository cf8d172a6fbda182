"""What a run shows while it goes: phase progress with elapsed time on stderr, the job's log on
stdout (stderr with --json, whose stdout holds only the final document).

On a terminal a rich status line shows the current phase and its elapsed time; with CI=true or no
TTY every change is one plain line, so CI logs stay readable and greppable.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

from gpucloud.prose import to_stderr
from gpucloud.ui import ci as ci_output


def plain_mode() -> bool:
    """CI=true or stderr not a terminal: no spinners, plain progress lines."""
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"} or not sys.stderr.isatty()


def fmt_seconds(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


WAIT_LINE_S = 30.0  # while something is awaited, a line at least this often (a VM boots for minutes)


AWAITED = {  # what a node's open stage is doing, for the wait lines
    "boot": "the machine to finish booting",
    "stack": "the driver/CUDA/framework install (stage stack)",
    "fetch": "the code download (stage fetch)",
    "inputs": "the inputs download (stage inputs)",
    "pull": "the container image pull (stage pull)",
    "setup": "the job's setup commands (stage setup)",
    "outputs": "the outputs upload (stage outputs)",
    "artifacts": "the artifacts upload (stage artifacts)",
}


def awaited(status: dict[str, Any] | None) -> str | None:
    """What a run's first node is waiting on, from its status: its first report while the machine
    boots, else its open stage; None while the job runs (its output is the progress) or at the end."""
    if not status:
        return "the machine to boot and report"
    stages = status.get("stages")
    if not isinstance(stages, dict):
        return None
    open_ = [
        n for n, v in stages.items() if isinstance(v, dict) and v.get("start") is not None and v.get("end") is None
    ]
    if not open_ or "run" in open_:
        return None
    last = str(open_[-1])
    return AWAITED.get(last, f"stage {last}")


class Progress:
    """Phase lines and job output of one CLI command. Use as a context manager."""

    def __init__(self, *, log_to_stderr: bool = False, plain: bool | None = None) -> None:
        self.t0 = time.monotonic()
        self._last_line = self.t0  # when the last progress line (or job output) was printed
        self._awaited: tuple[str, float] | None = None  # what `tick` says is awaited, and since when
        self.plain = plain_mode() if plain is None else plain
        self._log_stream: BinaryIO = (sys.stderr if log_to_stderr else sys.stdout).buffer
        self._fence = ci_output.LogFence(self._log_stream)  # the job's workflow commands are never run
        self._log_text = sys.stderr if log_to_stderr else sys.stdout
        self._phase: str | None = None
        self._phase_t0 = 0.0
        self._live: Any = None
        self._console: Any = None
        self._pending = b""  # a partial line held back while the live display is active

    # -- context ------------------------------------------------------------------------------------

    def __enter__(self) -> Progress:
        if not self.plain:
            try:
                from rich.console import Console
                from rich.live import Live

                self._console = Console(stderr=True)
                self._live = Live(
                    self._render(),
                    console=self._console,
                    refresh_per_second=4,
                    transient=True,
                    redirect_stdout=False,
                    redirect_stderr=False,
                    get_renderable=self._render,
                )
                self._live.start()
            except Exception:  # no usable terminal after all: fall back to plain lines
                self.plain, self._live = True, None
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        ci_output.phase_changed(None)  # CI hook: close an open group/section (docs/CI.md)
        if self._pending:
            self._write_log(self._pending, final=True)
        if self._live is not None:
            live, self._live = self._live, None
            live.stop()

    def _render(self) -> Any:
        from rich.text import Text

        if self._phase is None:
            return Text("")
        return Text.assemble(
            ("⠿ ", "cyan"),
            (self._phase, "bold"),
            f"  {fmt_seconds(time.monotonic() - self._phase_t0)}",
            ("   (total ", "dim"),
            (fmt_seconds(time.monotonic() - self.t0), "dim"),
            (")", "dim"),
        )

    # -- messages -----------------------------------------------------------------------------------

    def info(self, message: str) -> None:
        """One human line on stderr, prefixed with the time since the command started. It may hold what
        a machine wrote (a stage, a refused member's name): controls and workflow commands are fenced."""
        from gpucloud.ui.untrusted import shown_lines  # here: commands that print no progress never import it

        message = shown_lines(message)
        self._last_line = time.monotonic()
        stamp = f"[{fmt_seconds(self._last_line - self.t0):>6}] "
        if self._live is not None:
            self._live.console.print(stamp + message, markup=False, highlight=False, soft_wrap=True)
        else:  # wrapped, continuing under the message: the time stamps stay a column of their own
            to_stderr(stamp + message, continuation=" " * (len(stamp) + 2))

    def warn(self, message: str) -> None:
        from gpucloud.ui.untrusted import shown_lines

        message = shown_lines(message)  # as `info`: it may quote a machine
        if self._live is not None:
            self._live.console.print(f"warning: {message}", style="yellow", markup=False, highlight=False)
        else:
            to_stderr(f"warning: {message}")  # wrapped: a reason can be a paragraph

    def tick(self, awaited: str | None) -> None:
        """Called by a loop that waits (a booting machine, a stage): when nothing was printed for
        WAIT_LINE_S, one line saying what is awaited and for how long, so a log never goes quiet
        for minutes. None: nothing is awaited (the job's own output is the progress)."""
        now = time.monotonic()
        if awaited is None:
            self._awaited = None
            return
        if self._awaited is None or self._awaited[0] != awaited:
            self._awaited = (awaited, self._last_line)  # the wait began with the line printed last
        if now - self._last_line >= WAIT_LINE_S:
            self.info(f"still waiting for {awaited} ({fmt_seconds(now - self._awaited[1])})")

    @contextlib.contextmanager
    def waiting(self, awaited: str) -> Iterator[None]:
        """A blocking call (a cloud creating machines): `tick` from a daemon thread meanwhile, so a
        line still comes every WAIT_LINE_S while the caller's thread waits on the cloud."""
        done = threading.Event()

        def ticker() -> None:
            while not done.wait(1.0):
                self.tick(awaited)

        thread = threading.Thread(target=ticker, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(2.0)
            self._awaited = None

    def phase(self, name: str | None, note: str = "") -> None:
        """The run entered phase `name` (None: no phase shown any more)."""
        if name == self._phase:
            return
        self._phase, self._phase_t0 = name, time.monotonic()
        ci_output.phase_changed(name)  # CI hook: a collapsible group/section per phase (docs/CI.md)
        if name is not None:
            self.info(f"{name}{(' ' + note) if note else ''} ...")

    def phase_done(
        self, name: str, seconds: float, ok: bool | None = True, note: str = "", mark: str | None = None
    ) -> None:
        """The phase ended: done, FAILED, or the `mark` given (a spot machine "preempted")."""
        mark = mark or ("done" if ok or ok is None else "FAILED")
        self.info(f"{name} {mark} in {fmt_seconds(seconds)}{(' ' + note) if note else ''}")
        ci_output.phase_finished(name)  # CI hook: end of the phase's group/section (docs/CI.md)
        if self._phase == name:
            self._phase = None

    # -- job output ---------------------------------------------------------------------------------

    def log(self, data: bytes) -> None:
        """Job output as it arrives. Plain mode passes bytes through untouched; with the live
        display, whole lines are printed above it."""
        if not data:
            return
        self._last_line = time.monotonic()
        self._write_log(data, final=False)

    def _write_log(self, data: bytes, *, final: bool) -> None:
        if self._live is None:
            self._fence.write(data)
            self._log_stream.flush()
            return
        data = self._pending + data
        if not final:
            cut = data.rfind(b"\n") + 1
            data, self._pending = data[:cut], data[cut:]
        else:
            self._pending = b""
        if not data:
            return
        if self._log_text.isatty():
            # Same terminal as the status line: print above it (rich clears and redraws the line).
            text = data.decode("utf-8", errors="replace").rstrip("\n")
            self._live.console.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)
        else:  # stdout goes to a file or pipe: the bytes, untouched
            self._fence.write(data)
            self._log_stream.flush()
