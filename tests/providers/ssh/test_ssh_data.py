"""inputs: on a machine of the user's own: a local folder of the caller's copied onto the host through
the run's channel (docs/DATA.md), read by the job byte for byte."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.providers.ssh.test_ssh_e2e import cli_env, gpucloud, job, lab, server  # noqa: F401
from tests.support.sshd import SshLab


def test_local_folder_input_reaches_an_ssh_host(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    data = tmp_path / "local"
    files = {f"d{i % 3}/f{i}.bin": hashlib.sha256(str(i).encode()).digest() * 300 for i in range(12)}
    for rel, body in files.items():
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_bytes(body)
    expect = hashlib.sha256(b"".join(files[k] for k in sorted(files))).hexdigest()
    run = "cat $(find in -type f | sort) | sha256sum"
    spec = job(tmp_path, "sshdata", f"resources: {{cloud: ssh, hosts: [cpu1]}}\ninputs: {{in: ./local}}\nrun: {run}\n")
    res = gpucloud(cli_env, "run", str(spec), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert expect in res.stdout + res.stderr
    assert not list((server(lab, "cpu1").remote_root / "work").iterdir()), "teardown removes the work folder"
