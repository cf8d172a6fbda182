"""`python -m tests.support.azure_cli ARGS...`: the real gpucloud CLI, with budgets a loaded test
machine can meet.

The quota lookups (run's gate, `plan --json`, `check`) are bounded in seconds, and a lookup cut
off is only a note: right in use, but on a loaded 2-core machine building the first Azure clients
takes seconds, and the tests look at the verdicts. Nothing else changes; `gpucloud.cli.app.main`
runs exactly as the entry point runs it.
"""

from __future__ import annotations


def patient() -> None:
    from gpucloud.providers.azure import check
    from gpucloud.run import check as run_check
    from gpucloud.run import quota_gate

    quota_gate.BUDGET_S = 60.0
    quota_gate.plan_quotas.__defaults__ = (60.0,)
    run_check.run_checks.__defaults__ = (90.0,)
    check.QUOTAS_BY_S = 60.0


def main() -> None:
    patient()
    from gpucloud.cli.app import main as gpucloud_main

    gpucloud_main()


if __name__ == "__main__":
    main()
