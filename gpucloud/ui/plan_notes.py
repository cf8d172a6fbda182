"""The parts of `plan`'s printout that sum up many rows. Exclusions grouped for a reader: the rows
of one instance family on one cloud that are excluded for the same reason are one line ("K80
p2.*: not offered as of ... (12 rows)"), so a memory-range request does not print forty lines of
one retired family, each citing its sources (`plan --all-reasons` still lists every row with its
full reason; `--json` has every field). The prices' ages, per source and date, where they differ."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpucloud.contract.provider import Candidate, PriceSource
    from gpucloud.plan.planner import DataAge

_PRICE = re.compile(r"\$(\d+(?:\.\d+)?)/h")


class Excluded(Protocol):
    """What grouping reads of an exclusion (plan/rows.py Exclusion)."""

    @property
    def cloud(self) -> str: ...

    @property
    def region(self) -> str: ...

    @property
    def instance_type(self) -> str: ...

    @property
    def reason(self) -> str: ...


@dataclass
class Group:
    """Rows of one cloud and instance family excluded for the same reason (prices aside)."""

    cloud: str
    family: str
    head: str  # the reason without its parenthesised sources, a price as `$…/h`
    types: list[str] = field(default_factory=list)
    regions: list[str] = field(default_factory=list)
    reasons: set[str] = field(default_factory=set)
    prices: list[float] = field(default_factory=list)
    rows: int = 0

    def instance_types(self) -> str:
        """The type, or the family as `p2.*` when several of its types share the reason."""
        return self.types[0] if len(self.types) == 1 else f"{self.family}.*"

    def where(self) -> str:
        return self.regions[0] if len(self.regions) == 1 else f"{len(self.regions)} regions"

    def why(self) -> str:
        """The reason itself when every row gives the same one, else its common head (a price
        given as the range of the rows' prices), with the number of rows."""
        if len(self.reasons) == 1:
            text = next(iter(self.reasons))
        elif self.prices and min(self.prices) != max(self.prices):
            text = self.head.replace("$…/h", f"${min(self.prices):.3f}-{max(self.prices):.3f}/h", 1)
        else:
            text = self.head.replace("$…/h", f"${self.prices[0]:.3f}/h", 1) if self.prices else self.head
        return text + (f" ({self.rows} rows)" if self.rows > 1 else "")


def family_of(instance_type: str) -> str:
    """`p2.xlarge` -> `p2`; a name without a family part (an Azure size) is its own family."""
    return instance_type.split(".", 1)[0] if "." in instance_type else instance_type


def head_of(reason: str) -> str:
    """The reason up to its first parenthesis (where the sources and rules are cited)."""
    return reason.split(" (", 1)[0].strip() or reason


def group_exclusions(rows: Iterable[Excluded]) -> list[Group]:
    """Groups in the order of their first row (the catalog's order, as the long form lists them)."""
    groups: dict[tuple[str, str, str], Group] = {}
    for e in rows:
        head = head_of(e.reason)
        found = _PRICE.search(head)
        key_head = _PRICE.sub("$…/h", head, count=1)
        key = (e.cloud, family_of(e.instance_type), key_head)
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(e.cloud, key[1], key_head)
        if e.instance_type not in group.types:
            group.types.append(e.instance_type)
        if e.region not in group.regions:
            group.regions.append(e.region)
        group.reasons.add(e.reason)
        if found:
            group.prices.append(float(found[1]))
        group.rows += 1
    return list(groups.values())


PRICE_KINDS = {"shipped": "shipped", "estimate": "estimated from prices", "live": "live", "old": "kept old"}


def price_ages(shown: Sequence[Candidate], data: DataAge | None) -> list[str]:
    """The age of the prices shown, per source and date: one warning when they share one date
    (as the catalog's), one clause per source when they differ; nothing when none is stale."""
    if data is None:
        return []
    groups = _by_source([(c.price_source.kind, c.price_source.date) for c in shown if c.price_source is not None])
    ages = {key: _days_since(key[1]) for key in groups}
    if not any(age > data.max_age_days for age in ages.values()):
        return []
    refresh = "run `gpucloud catalog refresh` for current prices and offerings."
    dates = {date for _, date in groups}
    if len(dates) == 1:
        date = dates.pop()
        return [f"prices are {ages[next(iter(groups))]} days old ({data.origin} catalog, price date {date}); {refresh}"]
    return [f"the prices shown differ in age: {source_ages(groups)}; {refresh}"]


def _by_source(keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    groups: dict[tuple[str, str], int] = {}
    for key in keys:
        groups[key] = groups.get(key, 0) + 1
    return groups


def source_ages(groups: dict[tuple[str, str], int]) -> str:
    """`702 shipped of 2026-08-26: 103 days old; 4 estimated from prices of 2024: 1071 days old`."""
    return "; ".join(
        f"{n} {PRICE_KINDS.get(kind, kind)} of {date}: {_days_since(date)} days old"
        for (kind, date), n in sorted(groups.items(), key=lambda item: -item[1])
    )


def catalog_ages(sources: Iterable[tuple[str, str]]) -> str:
    """The catalog's rows counted per price source and date, each with its age."""
    return source_ages(_by_source(sources))


def source_cell(source: PriceSource | None) -> str:
    """A row's price source with the age of its price (`shipped 2026-08-26 103d`), so that every row
    says how old it is, not only a warning under the table."""
    if source is None:
        return "-"
    return f"{source.short()} {_days_since(source.date)}d" if source.date else source.short()


def _days_since(date_text: str) -> int:
    """Days since an ISO date as precise as its source (`2024`, `2026-08`, `2026-08-26T...`): a
    partial date counts from its start."""
    from datetime import date

    try:
        parts = [int(p) for p in date_text[:10].split("-")] + [1, 1]
        when = date(parts[0], parts[1] or 1, parts[2] or 1)
    except ValueError:
        return 0
    return max(0, (datetime.now(UTC).date() - when).days)
