"""The vCPU quotas of Azure's GPU size families, per location (Compute usages), read before a
launch and by `gpucloud check`.

A new subscription has 0 vCPUs of most GPU families in every location; without this a run learns
that only from a failed VM create per region (after the group, network and IP were made). One
usages call per location answers every family at once, all locations in daemon threads within one
budget: a lookup that is refused, unknown to the endpoint, or slow is a note, never a refusal (the
launch then finds out as before).

Which quota holds a VM (Azure "vCPU quotas", azure-compute-docs quotas.md and spot-vms.md): an
on-demand VM counts against its size family's quota ("Standard NCASv3_T4 Family vCPUs") and the
location's total ("Total Regional vCPUs", `cores`); a Spot VM only against "Total Regional Spot
vCPUs" (`lowPriorityCores`). The family of each size is its Resource SKUs `family`; the names
below are those (the sizes the catalog sells; read 2026-12 from the SKU family tables of the
OpenShift Azure install docs and `az vm list-usage` output in public repositories). A size not
named here is "family unknown": a note, and the launch is tried.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

BUDGET_S = 4.0
REGIONAL = "cores"  # Total Regional vCPUs
SPOT = "lowPriorityCores"  # Total Regional Spot vCPUs (ARM's name keeps "low priority")

# Size name -> its Resource SKUs family (the usages name). First match wins.
FAMILIES: tuple[tuple[str, str], ...] = (
    (r"^Standard_NC\d+as_T4_v3$", "standardNCASv3_T4Family"),
    (r"^Standard_NC\d+ads_A100_v4$", "StandardNCADSA100v4Family"),
    (r"^Standard_NC\d+adi?s_H100_v5$", "StandardNCadsH100v5Family"),
    (r"^Standard_NCC\d+ads_H100_v5$", "StandardNCCads2023Family"),
    (r"^Standard_ND96asr_v4$", "standardNDASv4_A100Family"),
    (r"^Standard_ND96amsr_A100_v4$", "StandardNDAMSv4_A100Family"),
    (r"^Standard_ND96isr_H100_v5$", "standardNDSH100v5Family"),
    (r"^Standard_ND96isr_H200_v5$", "standardNDISRH200V5Family"),
    (r"^Standard_ND40rs_v2$", "standardNDSv2Family"),
    (r"^Standard_NV\d+adm?s_A10_v5$", "StandardNVADSA10v5Family"),
    (r"^Standard_NV\d+s_v3$", "standardNVSv3Family"),
    (r"^Standard_NC\d+r?s_v3$", "standardNCSv3Family"),
    (r"^Standard_NC\d+r?_Promo$", "standardNCPromoFamily"),
    (r"^Standard_NC\d+r?$", "standardNCFamily"),
)


def family_of(instance_type: str) -> str | None:
    """The size's quota family (usages `name.value`), or None when this table does not know it."""
    return next((fam for pattern, fam in FAMILIES if re.match(pattern, instance_type, re.I)), None)


def gpu_families() -> list[str]:
    """Every family of the table, once each, in table order (`check` reports these)."""
    return list(dict.fromkeys(fam for _p, fam in FAMILIES))


def raise_command(name: str, region: str, subscription: str = "<subscription-id>") -> str:
    """How to ask for more: the `az quota` command (Azure CLI's quota extension) or the portal."""
    kind = "lowPriority" if name == SPOT else "dedicated"
    return (
        f"az quota update --resource-name {name} --resource-type {kind} --scope "
        f"/subscriptions/{subscription}/providers/Microsoft.Compute/locations/{region} "
        "--limit-object value=<vCPUs> (or the portal: Quotas > Compute, this location and family)"
    )


Usages = dict[str, tuple[float, float, str]]  # usage name (lower) -> (current, limit, portal name)


def read_usages(provider: Any, region: str) -> tuple[Usages | None, str]:
    """The location's usages ({name: (current, limit, localized name)}), or None and why not."""
    from gpucloud.providers.azure.errors import error_parts

    try:
        found: Usages = {}
        for u in provider.compute.usage.list(region):
            found[str(u.name.value).lower()] = (
                float(u.current_value or 0),
                float(u.limit or 0),
                str(u.name.localized_value or u.name.value),
            )
        return found, ""
    except Exception as exc:  # noqa: BLE001 - a lookup is advice (module doc)
        code, _message, status = error_parts(exc)
        said = code or (f"HTTP {status}" if status else type(exc).__name__)
        return None, f"Compute usages did not answer ({said})"


def read_many(regions: list[str], budget_s: float = BUDGET_S) -> tuple[dict[str, tuple[Usages | None, str]], str]:
    """region -> (usages, note) for every region, read concurrently within `budget_s`; and the
    subscription (for the fix command)."""
    found: dict[str, tuple[Usages | None, str]] = {}
    try:
        from gpucloud.providers.azure.provider import AzureProvider

        provider = AzureProvider()
        subscription = provider.subscription_id
    except Exception as exc:  # noqa: BLE001 - no credentials or subscription: every lookup is a note
        return {r: (None, f"no Azure session ({type(exc).__name__})") for r in regions}, "<subscription-id>"

    def one(region: str) -> None:
        found[region] = read_usages(provider, region)

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in dict.fromkeys(regions)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + budget_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    late = (None, f"Compute usages gave no answer within {budget_s:g} s")
    return {r: found.get(r, late) for r in regions}, subscription


def _binding(instance_type: str, spot: bool, usages: Usages, need: float) -> tuple[str, str, float | None, str]:
    """(quota name, portal name, limit, note) of the quota that decides: the first whose limit is
    below the need, else the family's (Spot: the regional Spot quota)."""
    family = SPOT if spot else family_of(instance_type)
    if family is None:
        return "", f"the vCPU quota of {instance_type}'s family", None, f"no quota family known for {instance_type}"
    names = [family] if spot else [family, REGIONAL]
    picked: tuple[str, str, float | None, str] | None = None
    for name in names:
        hit = usages.get(name.lower())
        if hit is None:
            continue
        current, limit, portal = hit
        note = f"{current:g} in use" if current and limit - current < need else ""
        row = (name, portal, limit, note)
        if limit < need:
            return row
        picked = picked or row
    return picked or (family, family, None, f"{family} is not among the location's usages")


def verdicts(asks: list[dict[str, Any]], budget_s: float = BUDGET_S) -> list[dict[str, Any]]:
    """Per ask ({region, instance_type, spot, vcpus}: the vCPUs the launch needs in all), whether
    the location's quota can hold it: `fits` True, False, or None (unknown, `note` says why). A
    limit below the need is certain to refuse; vCPUs in use may be freed by then (a failed
    attempt's VMs being deleted), so they are a note, not a skip."""
    values, subscription = read_many([str(a["region"]) for a in asks], budget_s)
    out = []
    for ask in asks:
        region, need, spot = str(ask["region"]), float(ask.get("vcpus") or 0), bool(ask["spot"])
        usages, note = values[region]
        if usages is None:
            code, name, limit = (SPOT if spot else family_of(str(ask["instance_type"])) or ""), "", None
        else:
            code, name, limit, note = _binding(str(ask["instance_type"]), spot, usages, need)
        out.append(
            {
                "region": region,
                "instance_type": ask["instance_type"],
                "spot": spot,
                "code": code,
                "name": name or code,
                "limit": limit,
                "need": need,
                "fits": None if limit is None or not need else limit >= need,
                "note": note,
                "fix": raise_command(code or "<family>", region, subscription),
            }
        )
    return out


def region_quotas(regions: list[str], budget_s: float = 5.0) -> list[dict[str, Any]]:
    """The GPU families, the regional and the Spot quota in each region (`gpucloud check`):
    {code, name, region, vcpus, note}. A family a location does not list (no such size there) is
    left out; a location whose usages were not read is one "unknown" regional row, with why."""
    values, _subscription = read_many(regions, budget_s)
    out: list[dict[str, Any]] = []
    for code in [*gpu_families(), REGIONAL, SPOT]:
        for region in regions:
            usages, note = values[region]
            if usages is None:
                if code == REGIONAL:
                    unknown = {"code": code, "name": "Total Regional vCPUs", "region": region, "vcpus": None}
                    out.append({**unknown, "note": note})
                continue
            hit = usages.get(code.lower())
            if hit is not None:
                out.append({"code": code, "name": hit[2], "region": region, "vcpus": hit[1], "note": ""})
    return out
