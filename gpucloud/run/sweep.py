"""What `gpucloud gc` could sweep, per provider, and its verdict: a provider that could not be
called (no credentials, an endpoint down) is named with its fix and exit 78 when it was asked for or
configured; one that swept only in part (a call it could not make, something of its own it could
not cancel or remove) is named per call and exits 75 (gc-incomplete). A sweep that checked no cloud
is never reported as clean."""

from __future__ import annotations

from datetime import datetime

from gpucloud.contract import registry as providers
from gpucloud.contract.tags import GcIncomplete
from gpucloud.errors import ConfigurationError, GpucloudError
from gpucloud.ui import views
from gpucloud.ui.untrusted import shown


class Sweep:
    """Which providers gc could sweep and which it could not (and why), so that a sweep that
    checked no cloud is never reported as clean."""

    def __init__(self) -> None:
        self.checked: list[str] = []
        self.failed: dict[str, str] = {}
        self.unfinished: list[str] = []  # what a provider could not check, or found and could not remove
        self.partly: list[str] = []  # the providers that said so (checked in part)

    def gc(self, cloud: str, now: datetime, *, dry_run: bool) -> list[str]:
        """One provider's tag sweep; a failure is noted and the other providers' sweeps go on."""
        try:
            lines = providers.get_provider(cloud).gc(now, dry_run=dry_run)
        except GcIncomplete as exc:  # it swept; some of its own it could not end or check: named, exit 75
            self.unfinished += exc.failures
            self.partly.append(cloud)
            lines = exc.lines
        except Exception as exc:  # one cloud's missing credentials must not stop the others' sweep
            why = exc.render() if isinstance(exc, GpucloudError) else f"{type(exc).__name__}: {exc}"
            self.failed.setdefault(cloud, shown(why.replace("\n", " "), limit=300))  # never a raw HTML body
            return []
        if cloud not in self.checked:
            self.checked.append(cloud)
        return lines

    def verdict(self, cloud: str | None, found: int) -> None:
        """Exit 78 naming what was not checked when the cloud asked for, any configured cloud, or
        every cloud could not be swept; a partial sweep says which clouds it left out."""
        wanted = [cloud] if cloud else list(providers.priced_clouds())
        missing = {
            c: self.failed.get(c) or f"no credentials found, not checked. {providers.info(c).credentials_hint}"
            for c in wanted
            if c not in self.checked
        }
        reasons = [f"{c}: {why}" for c, why in missing.items()]
        checked = ", ".join(c for c in self.checked if c not in self.partly)
        if self.partly:
            checked += ("; " if checked else "") + f"in part: {', '.join(dict.fromkeys(self.partly))}"
        checked = checked or "nothing"
        if not found:
            views.note(f"nothing to collect (checked: {checked})")
        if cloud and missing:
            raise ConfigurationError(f"gc could not check {cloud}.", reasons)
        if not cloud and (self.failed or not any(c in self.checked for c in wanted)):
            raise ConfigurationError(
                f"gc could not check every cloud (checked: {checked}); what it could not "
                "check may still hold paid resources.",
                reasons,
                hint="Fix the reasons above and run `gpucloud gc` again, or name the cloud you use with `--cloud`.",
            )
        if missing:
            views.note(f"gc checked {checked}; it did not check " + "; ".join(reasons))
        if self.unfinished:
            incomplete = GcIncomplete([], self.unfinished)
            incomplete.message = f"gc could not finish (checked: {checked}):\n  - " + "\n  - ".join(self.unfinished)
            incomplete.hint = (
                "What is named could not be checked or removed and may still cost money: fix its reason "
                "(a permission, the endpoint) and run `gpucloud gc` again."
            )
            raise incomplete
