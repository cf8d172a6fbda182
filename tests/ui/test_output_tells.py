"""Output that fits and tells, through the real CLI at COLUMNS=80 (or wider where the finding is
about a wide terminal): `check` wraps and names the cause of an unusable Azure; plan and catalog
keep the cloud (the region gives way first); an estimate is marked once; exclusions are grouped,
with `--all-reasons` for each row; a missing spot price is called that; price ages per source."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import REPO, clean_env, cli
from tests.support.text import flat, header, too_wide

# What DefaultAzureCredential raised on this machine with no Azure credentials (azure-identity 1.2x):
# the VS Code link is the last that does not say "unavailable", and is no cause at all.
CHAIN = """DefaultAzureCredential failed to retrieve a token from the included credentials.
Attempted credentials:
\tEnvironmentCredential: EnvironmentCredential authentication unavailable.
\tWorkloadIdentityCredential: WorkloadIdentityCredential authentication unavailable.
\tManagedIdentityCredential: ManagedIdentityCredential authentication unavailable.
\tSharedTokenCacheCredential: SharedTokenCacheCredential authentication unavailable.
\tVisualStudioCodeCredential: VisualStudioCodeCredential requires the 'azure-identity-broker' package to be installed.
\tAzureCliCredential: Azure CLI not found on path
\tAzurePowerShellCredential: PowerShell is not installed
\tAzureDeveloperCliCredential: Azure Developer CLI could not be found.
\tBrokerCredential: InteractiveBrowserBrokerCredential unavailable. The 'azure-identity-broker' package is required.
To mitigate this issue, please refer to the troubleshooting guidelines here at https://aka.ms/azsdk/python/identity."""


def test_azure_credential_summary_names_the_cause_not_the_last_link() -> None:
    from gpucloud.providers.azure.access import NO_CREDENTIALS, credential_summary

    assert credential_summary(CHAIN) == NO_CREDENTIALS
    assert "az login" in NO_CREDENTIALS and "AZURE_" in NO_CREDENTIALS and "managed identity" in NO_CREDENTIALS
    secret = CHAIN.replace(
        "EnvironmentCredential: EnvironmentCredential authentication unavailable.",
        "EnvironmentCredential: Authentication failed: AADSTS7000215: Invalid client secret provided.",
    )
    assert credential_summary(secret).startswith("EnvironmentCredential: Authentication failed: AADSTS7000215")


def test_check_wraps_every_line_and_says_why_azure_is_unusable(tmp_path: Path) -> None:
    env = clean_env(GPUCLOUD_HOME=str(tmp_path / "home"), AZURE_CONFIG_DIR=str(tmp_path / "no-azure"))
    out = cli("check", env=env, cwd=tmp_path)
    assert out.returncode == 78, out.stderr
    assert not too_wide(out.stdout) and not too_wide(out.stderr), too_wide(out.stdout + out.stderr)
    said = flat(out.stdout)
    assert "no Azure credentials found: az login / AZURE_* variables / managed identity" in said, said
    assert "VisualStudioCode" not in said and "azure-identity-broker" not in said


def test_plan_and_catalog_give_up_the_region_before_the_cloud() -> None:
    narrow = clean_env(64)
    out = cli("plan", "examples/t4-any-cloud.yaml", env=narrow, cwd=REPO)
    assert out.returncode == 0, out.stderr
    head = header(out.stdout, "cloud")
    assert "cloud" in head and "region" not in head, head
    assert "region" in flat(out.stderr) and "not shown" in out.stderr
    cat = cli("catalog", env=clean_env(), cwd=REPO)
    head = header(cat.stdout, "GPU")
    assert "cloud" in head and "region" not in head, head


def test_a_wide_plan_marks_an_estimate_once(tmp_path: Path) -> None:
    job = tmp_path / "b200.yaml"  # p6-b200.48xlarge: estimated in three regions (docs/CATALOG.md)
    job.write_text("name: b\nresources:\n  gpu: B200:8\nrun: nvidia-smi\n")
    out = cli("plan", str(job), env=clean_env(200), cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "ESTIMATE" in out.stdout and "(estimate price)" not in out.stdout, out.stdout
    narrow = cli("plan", str(job), env=clean_env(), cwd=REPO)  # the source column gives way: the market says it
    assert "ESTIMATE" not in narrow.stdout and "(estimate price)" in narrow.stdout, narrow.stdout
    cat = cli("catalog", "--gpu", "B200", env=clean_env(200), cwd=REPO)
    estimated = [line for line in cat.stdout.splitlines() if "ESTIMATE" in line]
    assert estimated and not any("*" in line for line in estimated), estimated


@pytest.fixture
def memory_range(tmp_path: Path) -> Path:
    spec = tmp_path / "mem.yaml"
    spec.write_text("name: mem\nresources:\n  gpu: {memory: 8GB..16GB}\nrun: python3 train.py\n")
    return spec


def test_exclusions_are_grouped_and_all_reasons_lists_each_row(memory_range: Path) -> None:
    for args in ([], ["--all"]):
        out = cli("plan", str(memory_range), *args, cwd=memory_range.parent, env=clean_env())
        assert out.returncode == 0, out.stderr
        assert not too_wide(out.stdout), too_wide(out.stdout)
        p2 = [line for line in out.stdout.splitlines() if "p2." in line]
        assert len(p2) == 1 and "not offered as of" in p2[0] and "(4 rows)" in p2[0], p2
        assert "moto" not in out.stdout and "--all-reasons" in flat(out.stdout)
    long = cli("plan", str(memory_range), "--all-reasons", cwd=memory_range.parent, env=clean_env())
    assert long.returncode == 0, long.stderr
    assert flat(long.stdout).count("moto 5.2.5 bundled AWS data") == 4  # each p2 row with its sources


def test_the_exclusions_keep_the_cloud_at_80_columns(memory_range: Path) -> None:
    out = cli("plan", str(memory_range), "--all-reasons", cwd=memory_range.parent, env=clean_env())
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "why excluded" in line)
    assert lines[at].split()[0] == "cloud", lines[at]


def test_prices_of_different_ages_are_dated_per_source(memory_range: Path) -> None:
    out = cli("plan", str(memory_range), cwd=memory_range.parent, env=clean_env())
    said = flat(out.stderr)
    assert "the prices shown differ in age" in said, said
    assert "shipped of 2026-08-26" in said and "shipped of 2024" in said, said


def test_a_missing_spot_price_is_not_called_a_missing_market() -> None:
    from gpucloud.plan.planner import make_plan
    from gpucloud.spec.load import parse_spec

    spec = parse_spec("name: s\nresources:\n  gpu: T4:1\n  spot: true\nrun: 'true'\n", "s.yaml")
    reasons = {e.reason for e in make_plan(spec).excluded}
    assert "no spot price in the catalog for this type here" in reasons
    assert not any("spot market" in r for r in reasons)


def test_catalog_gives_each_price_source_its_date_and_age() -> None:
    out = cli("catalog", "--gpu", "T4", env=clean_env(), cwd=REPO)
    said = flat(out.stderr)
    assert out.returncode == 0, out.stderr
    assert "shipped of 2026-08-26:" in said and "shipped of 2024:" in said and "days old" in said, said
    assert "shipped of 2026-06-18:" in said, said  # Azure's retail prices of every region
    said = flat(cli("catalog", "--gpu", "B200", env=clean_env(), cwd=REPO).stderr)
    assert "estimated from prices of" in said, said
