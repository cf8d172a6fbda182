"""Azurite (Microsoft's storage emulator, from npm) for Blob channel tests.

`.ci/run` installs it with `npm install --no-save azurite` into the repository's node_modules;
tests that need it skip with that instruction when it is missing. One server per test session,
blob service only, in memory, on a free port.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.fake_arm import AZURITE_ACCOUNT, AZURITE_KEY
from tests.support.procs import stop_process

REPO = Path(__file__).resolve().parents[2]
INSTALL_HINT = "Azurite is not installed: run `npm install --no-save azurite` in the repository root (.ci/run does)."


def azurite_binary() -> Path | None:
    local = REPO / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return local
    found = shutil.which("azurite-blob")
    return Path(found) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Azurite:
    port: int
    proc: subprocess.Popen[bytes]
    workdir: Path

    @property
    def blob_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"

    account_name: str = AZURITE_ACCOUNT
    account_key: str = AZURITE_KEY

    def stop(self) -> None:
        stop_process(self.proc)


def start_azurite(workdir: Path) -> Azurite:
    binary = azurite_binary()
    if binary is None:
        raise FileNotFoundError(INSTALL_HINT)
    workdir.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # a free port can be taken between probing and binding
        port = _free_port()
        log = open(workdir / "azurite.log", "ab")
        proc = subprocess.Popen(
            [
                str(binary),
                "--silent",
                "--inMemoryPersistence",
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(port),
                "--skipApiVersionCheck",
                "--disableTelemetry",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            env={**os.environ, "NODE_NO_WARNINGS": "1"},
        )
        server = Azurite(port=port, proc=proc, workdir=workdir)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(f"{server.blob_endpoint}?comp=list", timeout=1)
            except urllib.error.HTTPError:
                return server  # it answers (403 without auth): up
            except OSError:
                time.sleep(0.1)
                continue
            return server
        server.stop()
    raise RuntimeError(f"Azurite did not start; see {workdir / 'azurite.log'}")


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    if azurite_binary() is None:
        pytest.skip(INSTALL_HINT)
    server = start_azurite(tmp_path_factory.mktemp("azurite"))
    try:
        yield server
    finally:
        server.stop()
