"""A retired offering's date comes from the catalog data's `status_basis` column, never from its
source text: "announced" rows print the cloud's retirement date, "observed" rows print "not offered
as of <the day the data was read>". Checked in the shipped data and through the CLI (80 columns,
piped) on a catalog whose column says otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gpucloud.catalog as catalog_mod
from gpucloud.catalog import CatalogError, load_catalog
from tests.support.cli import ci_env, cli
from tests.support.text import flat

REPO = Path(__file__).resolve().parents[2]
# The dates the clouds announced (../shared/FACTS.md s1-2, docs/CATALOG.md "Status dates").
ANNOUNCED = {"p3": "2025-12-20", "Standard_NC6": "2023-09-06", "Standard_NC6s_v3": "2025-09-30"}


def test_every_retired_row_says_whether_its_date_was_announced_or_read() -> None:
    cat = load_catalog()
    retired = [o for o in cat.offerings if o.status == "retired"]
    assert retired
    for o in retired:
        family = o.instance_type.split(".")[0] if o.cloud == "aws" else o.instance_type
        if family == "p2":  # AWS never announced an end date for P2: the day moto's AWS data was read
            assert (o.status_basis, o.status_date) == ("observed", "2026-12-03"), o
            assert o.status_text() == "not offered as of 2026-12-03"
        elif family in ANNOUNCED:
            assert (o.status_basis, o.status_date) == ("announced", ANNOUNCED[family]), o
            assert o.status_text() == f"retired {o.status_date}"
    assert all(o.status_basis == "observed" for o in cat.offerings if o.status == "active")


def _shipped_csv() -> str:
    return (Path(catalog_mod.__file__).parent / "data" / "offerings.csv").read_text(encoding="utf-8")


def test_the_column_decides_not_the_source_text() -> None:
    gpus = catalog_mod._shipped_gpus()[0]
    lines = _shipped_csv().splitlines()
    p2 = next(i for i, line in enumerate(lines) if line.startswith("aws,p2.xlarge,K80,1,4,61,x86_64,us-east-1,"))
    assert ",retired,2026-12-03,observed," in lines[p2]
    lines[p2] = lines[p2].replace(",retired,2026-12-03,observed,", ",retired,2026-12-03,announced,")
    row = next(o for o in catalog_mod._load_offerings(gpus, "\n".join(lines)) if o.instance_type == "p2.xlarge")
    assert "not offered by the current" in row.source  # the prose is unchanged; only the column moved
    assert row.status_text() == "retired 2026-12-03" and not row.withdrawn


def test_a_status_basis_outside_the_two_values_names_its_line() -> None:
    gpus = catalog_mod._shipped_gpus()[0]
    lines = _shipped_csv().splitlines()
    lines[1] = lines[1].replace(",observed,", ",guessed,", 1)
    with pytest.raises(CatalogError, match=r"offerings.csv line 2: status_basis: 'guessed' is not one of"):
        catalog_mod._load_offerings(gpus, "\n".join(lines))


def test_the_cli_reads_the_column_of_the_catalog_it_uses(gpucloud_home: Path) -> None:
    """A refreshed catalog (the cache `catalog refresh` writes) whose p2 rows carry an announced date:
    `catalog --all`, `plan` and `gpus` print that date as a retirement date."""
    from gpucloud.catalog import offerings_db

    rows = [
        o._replace(status_basis="announced", status_date="2026-06-30") if o.instance_type.startswith("p2.") else o
        for o in load_catalog().offerings
    ]
    offerings_db.write(offerings_db.cache_file(), rows, created_at="2026-12-04T00:00:00Z", clouds={})
    listing = cli("catalog", "--gpu", "K80", "--all", env=ci_env(COLUMNS="80", PYTHONPATH=str(REPO)), timeout=60)
    assert listing.returncode == 0, listing.stderr
    text = flat(listing.stdout)
    assert "retired 2026-06-30" in text and "not offered as of" not in text
    assert all(len(line) <= 80 for line in listing.stdout.splitlines())
    gpus = cli("gpus", env=ci_env(COLUMNS="80", PYTHONPATH=str(REPO)), timeout=60)
    assert "K80: no longer offered: aws retired 2026-06-30; azure retired 2023-09-06" in flat(gpus.stderr)
    doc = next(
        d
        for d in json.loads(cli("gpus", "--json", env=ci_env(COLUMNS="80", PYTHONPATH=str(REPO)), timeout=60).stdout)
        if d["gpu"] == "K80"
    )
    assert {(r["cloud"], r["status_date"], r["status_basis"]) for r in doc["retired"]} == {
        ("aws", "2026-06-30", "announced"),
        ("azure", "2023-09-06", "announced"),
    }


def test_shipped_data_through_the_cli_plan_and_gpus(tmp_path: Path) -> None:
    spec = tmp_path / "k80.yaml"
    spec.write_text("name: k80\nresources:\n  gpu: K80:1\nrun: python3 train.py\n")
    plan = cli("plan", str(spec), env=ci_env(COLUMNS="80", PYTHONPATH=str(REPO)), timeout=60)
    assert plan.returncode == 2, plan.stderr
    text = flat(plan.stderr)
    assert "aws p2.xlarge, p2.8xlarge, p2.16xlarge (not offered as of 2026-12-03)" in text
    assert "Standard_NC6, Standard_NC12, Standard_NC24, Standard_NC24r (retired 2023-09-06)" in text
    assert "no end date was announced" in text and "retired 2026-12-03" not in text
    gpus = flat(cli("gpus", env=ci_env(COLUMNS="80", PYTHONPATH=str(REPO)), timeout=60).stderr)
    assert "K80: no longer offered: aws not offered as of 2026-12-03; azure retired 2023-09-06" in gpus
    assert "V100: no longer offered: aws retired 2025-12-20; azure retired 2025-09-30" in gpus
