"""Error classes that carry their CLI exit code, so every layer can fail clearly without tracebacks."""

from __future__ import annotations


class GpucloudError(Exception):
    """Base class: `message` is one readable paragraph; `exit_code` is what the CLI returns."""

    exit_code: int = 70

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        """The paragraph shown to the user (message, then the fix when there is one)."""
        return self.message if not self.hint else f"{self.message}\n{self.hint}"


class UserError(GpucloudError):
    """Bad input: a job file, a pin, a flag, a request nobody offers. Exit 2."""

    exit_code = 2


class NoCandidateError(GpucloudError):
    """Every candidate of the plan failed to provision. Exit 75; `attempts` lists each one."""

    exit_code = 75

    def __init__(self, message: str, attempts: list[str], *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.attempts = attempts

    def render(self) -> str:
        lines = [self.message, *(f"  - {a}" for a in self.attempts)]
        if self.hint:
            lines.append(self.hint)
        return "\n".join(lines)


class DeadlineExceeded(GpucloudError):
    """The run passed max_duration. Exit 124."""

    exit_code = 124


class Interrupted(GpucloudError):
    """Ctrl-C / SIGTERM: raised after teardown. Exit 130."""

    exit_code = 130


class InternalError(GpucloudError):
    """A bug or an unexpected cloud answer. Exit 70."""

    exit_code = 70
