"""A job file with SkyPilot or dstack keys: `validate` names gpucloud's equivalent of each (or says
there is none and what to do), never a spelling neighbour that means something else, gives a list
`run:` a message about scripts, and closes with `gpucloud import`."""

from __future__ import annotations

import pytest

from gpucloud.spec.load import parse_spec
from gpucloud.spec.values import SpecError

BASE = "name: x\nrun: echo hi\n"


def problems(text: str) -> tuple[dict[str, str], str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "job.yaml")
    return {i.field: i.message for i in caught.value.issues}, str(caught.value.hint or "")


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("name: x\nrun: echo\nresources:\n  accelerators: V100:1\n", "resources.accelerators", "resources.gpu"),
        ("name: x\ncommands: [python train.py]\nrun: echo\n", "commands", "run: |"),
        (BASE + "file_mounts: {/data: s3://b/x}\n", "file_mounts", "inputs: {data/: s3://"),
        (BASE + "type: task\n", "type", "remove it"),
        (BASE + "resources:\n  image_id: docker:pytorch\n", "resources.image_id", "container:"),
        (BASE + "resources:\n  ports: 8080\n", "resources.ports", "ports: at the top"),
        (BASE + "resources:\n  disk_tier: high\n", "resources.disk_tier", "no equivalent"),
    ],
)
def test_a_peer_key_names_gpucloud_equivalent(text: str, field: str, words: str) -> None:
    issues, hint = problems(text)
    assert words in issues[field], issues[field]
    assert "Did you mean" not in issues[field]  # ports is not spot, disk_tier is not disk_gb, image_id not image
    assert "gpucloud import job.yaml" in hint


def test_a_lone_peer_key_in_a_gpucloud_file_still_names_import() -> None:
    """No peer signature (type, commands, accelerators) but a peer's key: the import hint still comes."""
    issues, hint = problems(BASE + "resources:\n  gpu: T4\n  disk_tier: best\n")
    assert "disk_gb sets only the size" in issues["resources.disk_tier"]
    assert "gpucloud import job.yaml" in hint


def test_run_as_a_list_says_how_to_write_a_script() -> None:
    issues, _ = problems("name: x\nrun:\n  - pip install x\n  - python train.py\n")
    assert "a list of 2 commands" in issues["run"] and "`|`" in issues["run"]
    assert "Quote the value" not in issues["run"]
    issues, _ = problems("name: x\nrun: echo\nsetup: [a, b]\n")
    assert "a list of 2 commands" in issues["setup"]


def test_gpucloud_typos_keep_their_did_you_mean() -> None:
    issues, _ = problems(BASE + "envv: {A: 1}\n")
    assert "Did you mean 'env'?" in issues["envv"]


def test_the_schema_describes_what_people_write_and_hides_internals() -> None:
    """Editors show descriptions on hover: every field a newcomer writes has one, `cloud` is an
    enum, and the models' internal fields are not offered as keys."""
    from gpucloud.spec.load import json_schema

    schema = json_schema()
    defs = {k.lower(): v["properties"] for k, v in schema["$defs"].items()}
    top = schema["properties"]
    for key in ("secrets", "inputs", "outputs", "recovery", "container"):
        assert top[key].get("description"), key
    for key in ("cloud", "spot", "hosts", "cluster"):
        assert defs["resources"][key].get("description"), key
    for section in ("stackspec", "containerspec", "recovery", "inputform"):
        assert all(p.get("description") for p in defs[section].values()), section
    assert "ssh" in str(defs["resources"]["cloud"]) and "enum" in str(defs["resources"]["cloud"])
    assert "gpu_options" not in defs["resources"] and "other_models" not in defs["gpurequest"]
