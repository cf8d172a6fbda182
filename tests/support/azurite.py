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
    scheme: str = "http"

    @property
    def blob_endpoint(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"

    account_name: str = AZURITE_ACCOUNT
    account_key: str = AZURITE_KEY

    def stop(self) -> None:
        stop_process(self.proc)


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """(cert, key) for 127.0.0.1 and localhost, valid 2 days: the https of Azurite and its fronts."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
            + ["-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1"]
            + ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
            check=True,
            capture_output=True,
        )
    return cert, key


def start_azurite(workdir: Path, *, tls: tuple[Path, Path] | None = None) -> Azurite:
    """Azurite's blob service; with `tls` (cert, key) over https with OAuth on (`--oauth basic`:
    Bearer tokens are checked for issuer, audience and times, not signature or RBAC)."""
    import ssl

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
                *(["--cert", str(tls[0]), "--key", str(tls[1]), "--oauth", "basic"] if tls else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            env={**os.environ, "NODE_NO_WARNINGS": "1"},
        )
        server = Azurite(port=port, proc=proc, workdir=workdir, scheme="https" if tls else "http")
        context = ssl.create_default_context(cafile=str(tls[0])) if tls else None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(f"{server.blob_endpoint}?comp=list", timeout=1, context=context)
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
