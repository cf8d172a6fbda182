"""A new provider is its package and one registry line (docs/INTERNALS.md, "Adding a provider"):
a toy cloud written here, outside the product, is planned and runs a job end to end through the
real CLI in a subprocess, with no other product file changed. Its machines are this machine's
processes (the local provider's engine), so the run is real and needs no cloud."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpucloud.contract import registry as providers
from tests.support.cli import cli
from tests.support.local_runs import leftovers, run_id_of, write_job

# gpucloud/providers/toy/provider.py of a new provider: the Provider protocol and its capabilities.
TOY_PROVIDER = '''
"""A toy cloud: machines that are processes on this machine, under a name of its own."""

from dataclasses import replace

from gpucloud.providers.local.provider import LocalProvider


class ToyProvider(LocalProvider):
    name = "toy"
    capabilities = replace(LocalProvider.capabilities, heartbeat_interval=1.0)
'''
# Its one entry in gpucloud/contract/registry.py's REGISTRY.
REGISTRY_LINE = (
    'REGISTRY["toy"] = ProviderInfo("toy", "toycloud.provider", "ToyProvider", "a toy cloud", '
    'False, False, lambda: True, "Nothing to configure.")'
)
# The CLI with that line added before anything reads the registry (`python -m toy_gpucloud ARGS`).
ENTRY = f"""
import runpy

from gpucloud.contract.registry import REGISTRY, ProviderInfo

{REGISTRY_LINE}
runpy.run_module("gpucloud", run_name="__main__", alter_sys=True)
"""


def _toy_cli(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]))
    proc = cli(*args, env=env, cwd=tmp_path, module="toy_gpucloud", timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_a_toy_provider_is_its_package_and_one_registry_line(tmp_path: Path, gpucloud_home: Path) -> None:
    site = tmp_path / "site"
    (site / "toycloud").mkdir(parents=True)
    (site / "toycloud" / "__init__.py").write_text('"""The toy cloud."""\n')
    (site / "toycloud" / "provider.py").write_text(TOY_PROVIDER)
    (site / "toy_gpucloud.py").write_text(ENTRY)
    job = write_job(tmp_path / "job", {"name": "toyjob", "resources": {"cloud": "toy"}, "run": "echo hello-from-toy"})

    rc, out, err = _toy_cli(tmp_path, "plan", str(job), "--json")
    assert rc == 0, err
    assert {c["cloud"] for c in json.loads(out)["candidates"]} == {"toy"}

    rc, out, err = _toy_cli(tmp_path, "run", str(job))
    assert rc == 0, err
    run_id = run_id_of(err)
    assert "hello-from-toy" in out + err
    rc, out, err = _toy_cli(tmp_path, "status", run_id, "--json")
    doc = json.loads(out)
    assert doc["status"] == "succeeded" and doc["exit_code"] == 0
    assert [(a["cloud"], a["launched"], a["end_reason"]) for a in doc["attempts"]] == [("toy", True, "teardown")]
    assert all(r["status"] == "deleted" for r in doc["resources"])
    assert leftovers(gpucloud_home, run_id) == []
    assert "toy" not in providers.names()  # the product's registry is as it was: the line lived in the test
