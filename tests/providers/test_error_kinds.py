"""The error-code tables of docs/PROVIDERS.md ("AWS errors", "Azure errors") are what the classifiers
do: every row is read from the page and classified, so a code cannot change kind without the page,
and an error about one candidate never skips the whole cloud."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "PROVIDERS.md"
UNKNOWN = "SomeCodeNobodyDocumented"


def table(cloud: str) -> list[tuple[str, str, str]]:
    """(code, message hint, kind) per code of the page's table for `cloud`."""
    text = DOC.read_text()
    body = text.split(f"<!-- error-table: {cloud} -->", 1)[1].split("<!-- /error-table -->", 1)[0]
    rows: list[tuple[str, str, str]] = []
    for line in body.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        codes = re.findall(r"`([^`]+)`", cells[0]) or [UNKNOWN]
        note = re.search(r"\(([^)]*)\)", cells[0])
        rows += [(code, note[1] if note else "", cells[1]) for code in codes]
    assert len(rows) > 10
    return rows


def aws_kind(code: str, note: str) -> str:
    from botocore.exceptions import ClientError

    from gpucloud.providers.aws.access import classify_access, permission_denied
    from gpucloud.providers.aws.errors import classify, error_kind

    message = "Not authorized for images: [ami-0123456789abcdef0]" if "image" in note else "m"
    exc = ClientError({"Error": {"Code": code, "Message": message}}, "RunInstances")
    access = classify_access(exc) or permission_denied(exc, service="ec2")
    if access is not None:
        return access.kind
    err = classify(exc, region="us-east-1", instance_type="g4dn.xlarge", spot=False, what="launching")
    return "server" if err.kind == "throttle" and error_kind(code) == "server" else err.kind


class _ArmError:
    def __init__(self, code: str, message: str) -> None:
        self.code, self.message = code, message


def azure_kind(code: str, note: str) -> str:
    from azure.core.exceptions import HttpResponseError

    from gpucloud.providers.azure.errors import classify_error

    message = (
        "Operation could not be completed as it results in exceeding approved standardNCASv3_T4Family Cores quota."
        if "quota" in note
        else "m"
    )
    exc: Any = HttpResponseError(message=f"({code}) {message}")
    exc.error = _ArmError(code, message)
    exc.status_code = 409
    return classify_error(exc, where="creating the VM", instance_type="Standard_NC4as_T4_v3", region="eastus").kind


@pytest.mark.parametrize(("code", "note", "kind"), table("aws"), ids=lambda v: str(v)[:40])
def test_aws_table_row(code: str, note: str, kind: str) -> None:
    assert aws_kind(code, note) == kind


@pytest.mark.parametrize(("code", "note", "kind"), table("azure"), ids=lambda v: str(v)[:40])
def test_azure_table_row(code: str, note: str, kind: str) -> None:
    assert azure_kind(code, note) == kind


def test_no_cloud_is_skipped_for_an_error_about_one_candidate() -> None:
    """Every kind the tables use is one the failover knows; only fatal and the access kinds skip a cloud."""
    kinds = {k for cloud in ("aws", "azure") for _, _, k in table(cloud)}
    assert kinds <= {
        "capacity",
        "quota",
        "price",
        "throttle",
        "server",
        "candidate",
        "fatal",
        "credentials",
        "permission",
    }
    assert aws_kind(UNKNOWN, "") == "candidate" and azure_kind(UNKNOWN, "") == "candidate"
