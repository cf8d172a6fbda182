"""Quota before a launch on Azure (the fake ARM's Compute usages and its QuotaExceeded on a VM
create past a limit): `run` reads the usages of each candidate's location before any create,
skips a location whose family quota is below the request (naming the family, the numbers and the
`az quota` command), and launches in the next; nothing was created in the skipped location. A
lookup that is refused is a note, never a refusal; `plan --json` and `check` show the quotas."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpucloud.providers.azure.quota import family_of, verdicts
from tests.support.azure_fixtures import (  # noqa: F401  (fixtures)
    arm,
    azure_env,
    azurite,
    fake_arm_server,
    leftovers,
)
from tests.support.azure_quota import family as fake_family
from tests.support.azure_runs import write_azure_job
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.fake_arm import FakeArm

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]
T4 = "standardNCASv3_T4Family"
PATIENT = "tests.support.azure_cli"  # the CLI with quota budgets a loaded test machine can meet


def _ask(region: str, size: str = "Standard_NC4as_T4_v3", spot: bool = False, vcpus: int = 4) -> dict[str, object]:
    return {"region": region, "instance_type": size, "spot": spot, "vcpus": vcpus}


def test_every_catalog_size_has_the_family_azure_names_it() -> None:
    """gpucloud's size -> family table agrees with the fake's, written from Azure's usage names."""
    import csv
    from importlib.resources import files

    shipped = files("gpucloud.catalog") / "data" / "offerings.csv"  # the installed package's, as CI tests it
    with shipped.open() as f:
        sizes = {r["instance_type"] for r in csv.DictReader(f) if r["cloud"] == "azure" and r["status"] == "active"}
    assert sizes
    for size in sizes:
        ours, theirs = family_of(size), fake_family(size)
        assert ours is not None and theirs is not None, size
        assert ours.lower() == theirs[0].lower(), (size, ours, theirs)


def test_a_family_below_the_request_does_not_fit_and_names_the_fix(arm: FakeArm) -> None:
    arm.quotas.set("eastus", T4, 0)
    arm.quotas.set("westus2", "lowPriorityCores", 2)
    found = verdicts(
        [_ask("eastus"), _ask("southcentralus"), _ask("westus2", spot=True), _ask("eastus", "Standard_NX9_v9")]
    )
    low, fine, spot, unknown = found
    assert low["fits"] is False and low["code"] == T4 and low["limit"] == 0 and low["need"] == 4
    assert "az quota update --resource-name standardNCASv3_T4Family --resource-type dedicated" in low["fix"]
    assert f"/subscriptions/{arm.subscription_id}/providers/Microsoft.Compute/locations/eastus" in low["fix"]
    assert fine["fits"] is True
    assert spot["fits"] is False and spot["code"] == "lowPriorityCores" and "--resource-type lowPriority" in spot["fix"]
    assert unknown["fits"] is None and "no quota family known" in unknown["note"]


def test_the_regional_total_counts_too_and_in_use_is_a_note(arm: FakeArm) -> None:
    arm.quotas.set("eastus", "cores", 2)
    (found,) = verdicts([_ask("eastus")])
    assert found["fits"] is False and found["code"] == "cores" and found["name"] == "Total Regional vCPUs"


def test_a_refused_lookup_is_a_note_never_a_refusal(arm: FakeArm) -> None:
    assert arm.operator_role is not None
    arm.operator_role["actions"].remove("Microsoft.Compute/locations/usages/read")
    (found,) = verdicts([_ask("eastus")])
    assert found["fits"] is None and "AuthorizationFailed" in found["note"], found


def test_a_slow_lookup_is_a_note_within_the_budget(arm: FakeArm) -> None:
    import time

    arm.inject("GET", r"/usages$", code=None, delay=3.0)
    t0 = time.monotonic()
    (found,) = verdicts([_ask("eastus")], budget_s=0.5)
    assert time.monotonic() - t0 < 2.0
    assert found["fits"] is None and "no answer within 0.5 s" in found["note"]


@pytest.mark.slow
def test_run_skips_a_zero_quota_location_before_any_create(
    azure_env: dict[str, str], arm: FakeArm, azure_sim: AzureVmSimulator, tmp_path: Path
) -> None:
    arm.quotas.set("eastus", T4, 0)  # eastus is the cheaper of the two
    job = write_azure_job(tmp_path / "job.yaml", run="echo quota-ok", regions="[eastus, southcentralus]")
    proc = cli("run", str(job), "--yes", timeout=240, env=azure_env, module=PATIENT)
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, text[-3000:]
    assert "quota-ok" in text
    assert "skipping azure/eastus/Standard_NC4as_T4_v3 before launch" in text, text[-3000:]
    assert "quota standardNCASv3_T4Family" in text and "is 0 vCPUs in eastus, 4 needed" in text
    assert "az quota update" in text
    assert "attempt 1: azure/southcentralus/" in text, text[-3000:]
    assert re.search(r"skipped before launch: azure/eastus/Standard_NC4as_T4_v3: quota", text), text[-2000:]
    with arm.lock:
        eastus_puts = [p for m, p, _who in arm.calls if m == "PUT" and "-eastus" in p.lower()]
    assert eastus_puts == [], "no create call reached the zero-quota location"
    assert leftovers(arm) == []


def test_plan_json_and_check_show_azure_quota(azure_env: dict[str, str], arm: FakeArm, tmp_path: Path) -> None:
    arm.quotas.set("eastus", T4, 0)
    arm.quotas.set("westus2", T4, 8)
    job = write_azure_job(tmp_path / "job.yaml", run="echo", regions="[eastus, westus2]")
    out = cli("plan", str(job), "--json", timeout=180, env=azure_env, module=PATIENT)
    assert out.returncode == 0, out.stderr[-2000:]
    quota = {(q["region"], q["instance_type"]): q for q in json.loads(out.stdout)["quota"]}
    assert quota[("eastus", "Standard_NC4as_T4_v3")]["fits"] is False
    assert quota[("westus2", "Standard_NC4as_T4_v3")]["fits"] is True
    check = cli("check", "--cloud", "azure", "--json", timeout=180, env=azure_env, module=PATIENT)
    doc = json.loads(check.stdout)
    azure = next(c for c in doc["clouds"] if c["cloud"] == "azure") if "clouds" in doc else doc["azure"]
    t4 = {q["region"]: q["vcpus"] for q in azure["quotas"] if q["code"] == T4}
    assert t4["eastus"] == 0 and t4["westus2"] == 8
    human = cli("check", "--cloud", "azure", timeout=180, env=azure_env, module=PATIENT)
    flat = " ".join(human.stdout.split())
    assert "quota standardNCASv3_T4Family" in flat and "eastus 0" in flat and "westus2 8" in flat, flat[-2000:]


def test_check_names_a_gpu_family_at_zero_everywhere_with_the_fix(arm: FakeArm) -> None:
    from gpucloud.providers.azure import check
    from tests.support.fake_arm import FAKE_LOCATIONS

    for location in FAKE_LOCATIONS:
        arm.quotas.set(location, T4, 0)
    result = check.check()
    assert result.usable, result.problems
    (problem,) = [p for p in result.problems if T4 in p["problem"]]
    assert "0 vCPUs in every location read" in problem["problem"]
    assert "az quota update --resource-name standardNCASv3_T4Family" in str(problem["fix"])
    rows = {q["region"]: q["vcpus"] for q in result.quotas if q["code"] == T4}
    assert rows == dict.fromkeys(FAKE_LOCATIONS, 0)


def test_check_says_unknown_with_the_reason_when_usages_are_refused(arm: FakeArm) -> None:
    from gpucloud.providers.azure import check

    assert arm.operator_role is not None
    arm.operator_role["actions"].remove("Microsoft.Compute/locations/usages/read")
    result = check.check()
    assert result.usable and not [p for p in result.problems if "quota" in p["problem"]]
    unknown = [q for q in result.quotas if q["vcpus"] is None]
    assert unknown and all(q["code"] == "cores" and "AuthorizationFailed" in q["note"] for q in unknown)
