"""A bucket or https URL written wrong (one slash, none, an upper-case scheme) is refused at
validate with file:line and the URL it most likely meant, instead of being taken as a local path
that fails only on the machine."""

from __future__ import annotations

import pytest

from gpucloud.spec.load import parse_spec
from gpucloud.spec.values import SpecError

JOB = "name: x\nresources:\n  cloud: local\nrun: echo\n{section}:\n  data/: {value}\n"


@pytest.mark.parametrize(
    ("value", "meant"),
    [
        ("s3:/bucket/x", "s3://bucket/x"),
        ("s3:bucket/x", "s3://bucket/x"),
        ("S3://bucket/x", "s3://bucket/x"),
        ("az:/account/container", "az://account/container"),
        ("https:/example.com/data.tar", "https://example.com/data.tar"),
        ("http:/example.com/data.tar", "https://example.com/data.tar"),
    ],
)
@pytest.mark.parametrize("section", ["inputs", "outputs"])
def test_a_malformed_url_is_refused_with_the_url_meant(value: str, meant: str, section: str) -> None:
    if section == "outputs" and meant.startswith("https"):
        pytest.skip("outputs take buckets only")
    with pytest.raises(SpecError) as caught:
        parse_spec(JOB.format(section=section, value=value), "job.yaml")
    (issue,) = caught.value.issues
    assert (issue.file, issue.line, issue.field) == ("job.yaml", 6, f"{section}.data/")
    assert meant in issue.message, issue.message


@pytest.mark.parametrize("value", ["s3://bucket/x", "./s3:notes", "data"])
def test_good_urls_and_paths_still_pass(value: str) -> None:
    parse_spec(JOB.format(section="inputs", value=value), "job.yaml")
