"""A region a job (or `--region`) names that the catalog in use has no row for.

It is either a typo or a real region the catalog does not cover yet (the shipped file has the regions
its sources list; a refresh adds what the cloud sells to the account). Treating a real region as a
typo sends the user to a wrong "did you mean", so the answer depends on the name's shape
(`ProviderInfo.region_pattern`): a name shaped like a region of a priced cloud gets the refresh
command (and, one edit from a known region, that region as a possible typo); anything else gets the
closest known names.
Either way the job stops with exit 2 (docs/CATALOG.md, "Shipped regions").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from gpucloud.errors import UserError


def edit_distance(a: str, b: str) -> int:
    """Edits (insert, delete, substitute, swap two neighbours) that turn `a` into `b`: a swapped pair
    ("eastsu") is one slip of the fingers, as a wrong letter is."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def shaped_clouds(name: str, clouds: Iterable[str]) -> list[str]:
    """The priced clouds whose region names look like `name`."""
    from gpucloud.contract import registry as providers

    out = []
    for cloud in clouds:
        pattern = providers.info(cloud).region_pattern
        if pattern and re.fullmatch(pattern, name):
            out.append(cloud)
    return out


def unknown_region(name: str, where: str, known: Mapping[str, Iterable[str]]) -> UserError:
    """The exit-2 error for a region no row of the catalog has; `known` is cloud -> its regions.
    A region-shaped name is never called unknown: real AWS names are often one key from another
    (mx-central-1 / me-central-1, ap-southeast-7 / ap-southeast-1), so a near name is only offered."""
    import difflib

    regions = sorted({r for rs in known.values() for r in rs})
    near = [r for r in regions if edit_distance(name, r) <= 1]
    shaped = shaped_clouds(name, known)
    if shaped:
        lead = f"Did you mean {', '.join(near)}? If not: " if near else ""
        return UserError(
            f"{where}: region {name!r} is not in the catalog you have: `gpucloud catalog refresh --region {name}`",
            hint=f"{lead}the refresh reads {' and '.join(shaped)}'s offerings there (it needs the cloud's "
            f"credentials); the catalog in use has {len(regions)} regions (`gpucloud catalog --all` lists them).",
        )
    close = near or difflib.get_close_matches(name, regions, n=3)
    hint = f"Did you mean {', '.join(close)}?" if close else f"Known regions: {', '.join(regions)}."
    return UserError(f"{where}: region {name!r} is not one gpucloud knows.", hint=hint)
