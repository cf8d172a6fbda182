"""The node's own Azure Blob authorisation: a storage token of the VM's managed identity, from the
Azure IMDS, sent as `Authorization: Bearer` (docs/PROVIDERS.md, "Azure node identity").

A service SAS is signed by the CLI with the storage account's key and lives at most 7 days (the
channel caps it there); a run longer than that, or a key rotated by its owner, leaves the node
without a channel. Where the manifest says `node_identity managed`, each SAS URL the node holds is
sent with the SAS fields dropped and the VM's own token instead: same method, host, path and the
other query fields (`comp=appendblock`), plus `x-ms-version` (Bearer needs 2017-11-09 or later) and
`x-ms-date`. The role assignment behind the token admits only this run's blobs; a URL it cannot
reach (a 4xx) is sent with its SAS, which covers the seconds before a new assignment is seen.
Tokens are read again 5 minutes before they expire (IMDS caches them and hands out a fresh one
then), every 10 s while IMDS answers without one, every minute while it does not answer or refuses.
Stdlib only, Python >= 3.8.

Sources: "How to use managed identities for Azure resources on an Azure VM to acquire an access
token" (https://learn.microsoft.com/entra/identity/managed-identities-azure-resources/how-to-use-vm-token:
`GET /metadata/identity/oauth2/token?api-version=2018-02-01&resource=...` with `Metadata: true`,
`expires_on` in epoch seconds, "cache the token ... refresh it before it expires");
"Authorize access to blobs using Microsoft Entra ID"
(https://learn.microsoft.com/azure/storage/blobs/authorize-access-azure-active-directory:
resource `https://storage.azure.com/`, Bearer over HTTPS only, x-ms-version 2017-11-09 or later).
"""

from __future__ import annotations

import json
import threading
import time
from email.utils import formatdate
from typing import Callable, List, Optional, Tuple
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from gpucloud.vm.protocol import AZURE_STORAGE_VERSION

IDENTITY_LINE = "node_identity managed"  # the manifest line that turns the node's own token on
IDENTITY = "managed"
RESOURCE = "https://storage.azure.com/"
TOKEN_PATH = "/metadata/identity/oauth2/token?api-version=2018-02-01&resource="
REFRESH_BEFORE_S = 300.0
RETRY_AFTER_S = 10.0  # IMDS answered without a token (an identity still being made): ask again after this
NO_IMDS_RETRY_S = 60.0  # no IMDS answer (not on Azure, or IMDS refused): the SAS URLs, and ask again later
# The query fields of a service or user-delegation SAS (Azure "Create a service SAS"), dropped when
# the node sends its own token; any other field (comp, blockid) stays.
SAS_FIELDS = frozenset(
    "sv ss srt sp se st spr sip si sr sig skoid sktid skt ske sks skv saoid suoid scid sdd ses "
    "rscc rscd rsce rscl rsct".split()
)

Request = Callable[..., Optional[bytes]]  # Transfer.request: (method, url, headers, max_time=) -> body


def is_sas(url: str) -> bool:
    """An https Blob URL that carries a SAS signature (Bearer is refused over plain http)."""
    parts = urlsplit(url)
    return parts.scheme == "https" and any(k == "sig" for k, _ in parse_qsl(parts.query, keep_blank_values=True))


def without_sas(url: str) -> str:
    parts = urlsplit(url)
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in SAS_FIELDS]
    query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in kept)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))


def parse_token(body: bytes) -> Optional[Tuple[str, float]]:
    """IMDS's token document: (access token, expiry in epoch seconds), or None."""
    try:
        doc = json.loads(body.decode("utf-8"))
        token = str(doc["access_token"])
        expires = float(doc.get("expires_on") or 0) or time.time() + float(doc.get("expires_in") or 0)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return (token, expires) if token and expires > 0 else None


class ManagedIdentityToken:
    """The VM's storage token from IMDS, cached until 5 minutes before it expires."""

    def __init__(self, request: Request, imds: str, now: Callable[[], float] = time.time) -> None:
        self._request = request
        self.url = imds.rstrip("/") + TOKEN_PATH + quote(RESOURCE, safe="")
        self._now = now
        self._token: Optional[Tuple[str, float]] = None
        self._next_try = 0.0
        self._lock = threading.Lock()
        self.fetches = 0  # token documents read (a test's count)

    def get(self) -> Optional[str]:
        now = self._now()
        with self._lock:
            held = self._token
            if held is not None and held[1] - now > REFRESH_BEFORE_S:
                return held[0]
            if now >= self._next_try:
                body = self._request("GET", self.url, ["Metadata: true"], max_time=5)
                self.fetches += 1
                fresh = parse_token(body) if body else None
                if fresh is not None:
                    self._token = held = fresh
                else:
                    self._next_try = now + (RETRY_AFTER_S if body is not None else NO_IMDS_RETRY_S)
            return held[0] if held is not None and held[1] > now + 30 else None


class BlobBearer:
    """Sends a SAS URL's request with the VM's own token instead, when it has one."""

    hides_missing = False  # Blob answers 404 for a missing blob the token may read: a 403 is a refusal

    def __init__(self, token: ManagedIdentityToken, now: Callable[[], float] = time.time) -> None:
        self.token = token
        self._now = now

    def signed(self, method: str, url: str, region: Optional[str] = None) -> Optional[Tuple[str, List[str]]]:
        """(URL without its SAS, headers), or None (not an https SAS URL, or no token yet)."""
        if not is_sas(url):
            return None
        token = self.token.get()
        if token is None:
            return None
        headers = [
            f"Authorization: Bearer {token}",
            f"x-ms-version: {AZURE_STORAGE_VERSION}",
            f"x-ms-date: {formatdate(self._now(), usegmt=True)}",
        ]
        return without_sas(url), headers
