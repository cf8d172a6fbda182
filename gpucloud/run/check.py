"""`gpucloud check`: can this machine use each cloud, as whom, where, and with how much GPU quota?

Each provider with a `check` in the registry (providers/__init__.py) tests itself: credentials
found or not, whose they are, the enabled regions, the GPU quotas it knows, every problem with its
fix. The checks run concurrently, each bounded to CHECK_TIMEOUT_S. Exit 0 when at least one checked
cloud is usable, else 78 (configuration).
"""

from __future__ import annotations

import threading
import time

from gpucloud.contract import registry as providers
from gpucloud.contract.provider import CloudCheck
from gpucloud.errors import UserError

CHECK_TIMEOUT_S = 10.0


def run_checks(clouds: list[str], timeout: float = CHECK_TIMEOUT_S) -> list[CloudCheck]:
    """Every cloud's check at once, in daemon threads (a hung SDK call must not keep the process
    alive); one that takes longer than `timeout` is reported as such."""
    found: dict[str, CloudCheck] = {}
    threads = [threading.Thread(target=lambda c=c: found.__setitem__(c, _timed(c)), daemon=True) for c in clouds]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    results = []
    for cloud in clouds:
        result = found.get(cloud)
        if result is None:
            result = CloudCheck(cloud, seconds=timeout)
            result.problem(f"{cloud}: no answer within {timeout:.0f} s", "Check the network and the endpoint settings.")
        results.append(result)
    return results


def _timed(cloud: str) -> CloudCheck:
    t0 = time.monotonic()
    try:
        result = providers.run_check(cloud)
    except Exception as exc:  # noqa: BLE001 - a check never crashes the command
        result = CloudCheck(cloud)
        result.problem(f"{cloud}: the check failed: {type(exc).__name__}: {exc}", None)
    result.seconds = time.monotonic() - t0
    return result


def _quota_lines(quotas: list[dict[str, object]]) -> list[str]:
    """One line per quota code: its value in each region ("unknown" with the first note)."""
    by_code: dict[str, list[dict[str, object]]] = {}
    for q in quotas:
        by_code.setdefault(str(q["code"]), []).append(q)
    lines = []
    for code, rows in by_code.items():
        values = ", ".join(
            f"{q['region']} {'unknown' if q['vcpus'] is None else format(q['vcpus'], 'g')}" for q in rows
        )
        notes = next((str(q["note"]) for q in rows if q["note"] and q["vcpus"] is None), "")
        lines.append(f"  quota     {code} {rows[0]['name']} (vCPUs): {values}" + (f" ({notes})" if notes else ""))
    return lines


def print_checks(results: list[CloudCheck]) -> None:
    """Human report: one block per cloud; problems with their fixes. Every line is wrapped to the
    output width, continuing under its value (a region list or a fix is often longer than a line)."""
    from gpucloud.prose import fill, output_width

    lines: list[str] = []
    for r in results:
        head = "ok" if r.usable else "NOT USABLE"
        lines.append(f"{r.cloud}: {head} ({r.seconds:.1f}s)")
        if r.identity:
            lines.append("  identity  " + ", ".join(f"{k} {v}" for k, v in r.identity.items() if v))
        if r.regions:
            lines.append(f"  regions   {len(r.regions)} enabled: {', '.join(r.regions)}")
        lines.extend(_quota_lines(r.quotas))
        for piece in r.setup:
            detail = f" ({piece['detail']})" if piece["detail"] else ""
            lines.append(f"  setup     {piece['piece']}: {piece['state']}{detail}")
        for p in r.problems:
            lines.append(f"  problem   {p['problem']}")
            if p["fix"]:
                lines.append(f"  fix       {p['fix']}")
    width = output_width()
    print("\n".join(fill(line, width, continuation=" " * 12) for line in lines))


def check_command(cloud: str | None, *, json_out: bool) -> int:
    """`gpucloud check`: returns the exit code (0 if some checked cloud is usable, else 78)."""
    from gpucloud.ui.jsonout import emit

    known = providers.with_check()
    if cloud is not None and cloud not in known:
        raise UserError(
            f"--cloud {cloud!r}: check knows {', '.join(known)}.",
            hint=f"Use --cloud {known[0]}, or leave --cloud out to check every cloud.",
        )
    results = run_checks([cloud] if cloud else list(known))
    code = 0 if any(r.usable for r in results) else 78
    if json_out:
        emit(
            {
                "clouds": [r.as_json() for r in results],
                "usable": [r.cloud for r in results if r.usable],
                "exit_code": code,
            }
        )
    else:
        print_checks(results)
    return code
