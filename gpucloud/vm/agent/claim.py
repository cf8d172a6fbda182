"""The node's own Ed25519 key (docs/SECURITY.md, "Channel grants and user-data"): made at boot,
never sent anywhere; its public half claims the node (a `claim-<fp>` object under the log grant,
or a line of Azure's claim blob), in the background while the node boots; the final status is
signed with it. The stdlib has no Ed25519, so `openssl` does the key and the signatures.
Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import base64
import binascii
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from gpucloud.vm import protocol
from gpucloud.vm.agent.transfer import Transfer
from gpucloud.vm.agent.uploads import LogUpload, claim_append

CLAIM_WAIT_S = 30.0
ED25519_SPKI = bytes.fromhex("302a300506032b6570032100")  # DER before the 32 raw bytes of a public key


class NodeKey:
    def __init__(self, vm_dir: Path, log: Callable[[str], None]) -> None:
        self.key_path = vm_dir / ".vmkey"
        self.pub_path = vm_dir / "claim"
        self.published_path = vm_dir / "claim.published"
        self.done_path = vm_dir / "claim.done"  # the watchdog process sees the claim end here
        self.log = log
        self.done = threading.Event()

    def make(self) -> Optional[str]:
        """A fresh key; its public half (base64 of the raw 32 bytes), or None without openssl."""
        try:
            self.key_path.unlink()
        except OSError:
            pass
        old = os.umask(0o077)
        gen: Any = None
        der: Any = None
        try:
            gen = subprocess.run(
                ["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(self.key_path)],
                capture_output=True,
                check=False,
                timeout=30,
            )
            der = subprocess.run(
                ["openssl", "pkey", "-in", str(self.key_path), "-pubout", "-outform", "DER"],
                capture_output=True,
                check=False,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            pass
        finally:
            os.umask(old)
        if gen is None or der is None or gen.returncode or der.returncode or len(der.stdout) < 32:
            try:
                self.key_path.unlink()
            except OSError:
                pass
            return None
        return base64.b64encode(der.stdout[-32:]).decode()

    def claim(self, upload: LogUpload, claim_url: str, transfer: Transfer) -> None:
        """Make the key and publish it; `done` is set whatever happened (the final push waits on it)."""
        try:
            pub = self.make()
            if pub is None:
                self.log("cannot make this node's key (openssl with Ed25519 is needed): its results will not be taken")
                return
            self.pub_path.write_text(pub + "\n")
            sent = claim_append(claim_url, transfer, self.pub_path)
            if sent is None:
                sent = upload.claim(self.pub_path, protocol.claim_name(pub))
            if sent:
                self.published_path.touch()
            else:
                self.log("cannot publish this node's key: its results will not be taken")
        finally:
            self.mark_done()

    def mark_done(self) -> None:
        try:
            self.done_path.touch()
        except OSError:
            pass
        self.done.set()

    def is_done(self) -> bool:
        return self.done.is_set() or self.done_path.exists()

    def reuse(self) -> bool:
        """After a reboot the node keeps the key it already published: a second would be a second claim."""
        if self.key_path.is_file() and self.key_path.stat().st_size and self.published_path.exists():
            self.mark_done()
            return True
        return False

    def public(self) -> str:
        """The public key this node claimed itself with (base64), '' when it has none."""
        try:
            return self.pub_path.read_text().strip() if self.published_path.exists() else ""
        except OSError:
            return ""

    def sign(self, raw: bytes, wait: Callable[[threading.Event, float], bool]) -> Optional[str]:
        """The base64 signature over `raw`, or None (no key)."""
        for _ in range(int(CLAIM_WAIT_S / 0.1)):
            if self.is_done() or wait(self.done, 0.1):
                break
        if not (self.key_path.is_file() and self.key_path.stat().st_size):
            return None
        # openssl 3 signs Ed25519 in one shot and needs the input's size: a file, not stdin.
        data = self.key_path.with_name(f".sign.{threading.get_ident()}")
        try:
            data.write_bytes(raw)
            out = subprocess.run(
                ["openssl", "pkeyutl", "-sign", "-inkey", str(self.key_path), "-rawin", "-in", str(data)],
                capture_output=True,
                check=False,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        finally:
            try:
                data.unlink()
            except OSError:
                pass
        return base64.b64encode(out.stdout).decode() if out.returncode == 0 and out.stdout else None


def verify(pub_b64: str, data: bytes, sig_b64: str) -> bool:
    """Whether `sig_b64` is the Ed25519 signature of `data` by the key `pub_b64` (openssl; False
    without it, or for anything malformed)."""
    try:
        raw, sig = base64.b64decode(pub_b64, validate=True), base64.b64decode(sig_b64, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(raw) != 32 or len(sig) != 64:
        return False
    folder = tempfile.mkdtemp(prefix="gpucloud-verify.")
    try:
        pem = base64.encodebytes(ED25519_SPKI + raw).decode()
        paths = {n: os.path.join(folder, n) for n in ("pub.pem", "data", "sig")}
        with open(paths["pub.pem"], "w") as fh:
            fh.write(f"-----BEGIN PUBLIC KEY-----\n{pem}-----END PUBLIC KEY-----\n")
        for name, value in (("data", data), ("sig", sig)):
            with open(paths[name], "wb") as out:
                out.write(value)
        argv = ["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", paths["pub.pem"], "-rawin"]
        done = subprocess.run(
            argv + ["-in", paths["data"], "-sigfile", paths["sig"]], capture_output=True, check=False, timeout=30
        )
        return done.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(folder, ignore_errors=True)
