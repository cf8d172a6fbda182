"""The node's own S3 signature: SigV4 from the instance's role credentials (IMDSv2), so its
uploads outlive the credentials of the CLI that launched it (docs/PROVIDERS.md, "AWS node identity").

A presigned URL dies with the credentials that signed it, and a CLI's are often an hour's SSO or
OIDC session. Where the manifest says `node_identity imds`, every presigned S3 URL the node holds is
sent signed by the node itself instead: the same method, host, path and query (the `X-Amz-*`
presign fields dropped), an `Authorization` header over them with the instance profile's
credentials, and the region from the URL's own credential scope. The role admits only this run's
objects; a URL it cannot reach (a 4xx) is sent as presigned, which covers the seconds before a new
role's credentials reach IMDS. Credentials are read again 5 minutes before they expire (EC2 has new
ones in IMDS by then) and at most every 10 s while IMDS has none. Stdlib only, Python >= 3.8.

Sources: AWS Signature Version 4 for S3, "Authenticating Requests: Using the Authorization Header"
(https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html, UNSIGNED-PAYLOAD);
EC2 User Guide, "Retrieve security credentials from instance metadata"
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instance-metadata-security-credentials.html).
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import json
import threading
import time
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED = "UNSIGNED-PAYLOAD"
IDENTITY_LINE = "node_identity imds"  # the manifest line that turns the node's own signature on
REFRESH_BEFORE_S = 300.0  # EC2 puts new role credentials in IMDS at least 5 minutes before expiry
RETRY_AFTER_S = 10.0  # IMDS without credentials (a role still propagating): asked again after this
NO_IMDS_RETRY_S = 300.0  # no IMDS answer at all (not on EC2): the presigned URLs, and ask again later
TOKEN_TTL_S = 21600
CREDS_PATH = "/latest/meta-data/iam/security-credentials/"

Request = Callable[..., Optional[bytes]]  # Transfer.request: (method, url, headers, max_time=) -> body


class Credentials(NamedTuple):
    access_key: str
    secret_key: str
    token: str
    expires: float  # epoch seconds


def scope_region(url: str) -> Optional[str]:
    """The region of a SigV4 presigned S3 URL (its `X-Amz-Credential` scope), else None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return None
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "X-Amz-Credential":
            return credential_region(value)
    return None


def credential_region(credential: str) -> Optional[str]:
    """`AKID/20240101/<region>/s3/aws4_request` -> region (an S3 scope only)."""
    fields = credential.split("/")
    if len(fields) == 5 and fields[3] == "s3" and fields[4] == "aws4_request" and fields[2]:
        return fields[2]
    return None


def _q(text: str) -> str:
    return quote(text, safe="-_.~")


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def sign(method: str, url: str, creds: Credentials, region: str, now: float) -> Tuple[str, List[str]]:
    """(the URL without its presign fields, the headers to send): an S3 request signed in the
    Authorization header, payload unsigned (the body is not read twice: a multi-GB artifacts file)."""
    parts = urlsplit(url)
    params = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not k.startswith("X-Amz-")]
    query = "&".join(f"{k}={v}" for k, v in sorted((_q(k), _q(v)) for k, v in params))
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    headers = {"host": parts.netloc.lower(), "x-amz-content-sha256": UNSIGNED, "x-amz-date": amz_date}
    if creds.token:
        headers["x-amz-security-token"] = creds.token
    names = sorted(headers)
    signed = ";".join(names)
    canonical = "\n".join(
        [method, parts.path or "/", query, "".join(f"{n}:{headers[n]}\n" for n in names), signed, UNSIGNED]
    )
    scope = f"{amz_date[:8]}/{region}/s3/aws4_request"
    to_sign = "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode("utf-8")).hexdigest()])
    key = _hmac(("AWS4" + creds.secret_key).encode("utf-8"), amz_date[:8])
    for part in (region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    auth = f"{ALGORITHM} Credential={creds.access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
    out = [f"Authorization: {auth}"] + [f"{n}: {headers[n]}" for n in names if n != "host"]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, "")), out


def parse_credentials(body: bytes) -> Optional[Credentials]:
    """IMDS's credentials document (`Code: Success`), or None."""
    try:
        doc = json.loads(body.decode("utf-8"))
        if doc.get("Code", "Success") != "Success":
            return None
        expires = float(calendar.timegm(time.strptime(str(doc["Expiration"]), "%Y-%m-%dT%H:%M:%SZ")))
        return Credentials(str(doc["AccessKeyId"]), str(doc["SecretAccessKey"]), str(doc.get("Token") or ""), expires)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class ImdsCredentials:
    """The instance profile's credentials from IMDSv2, cached until 5 minutes before they expire."""

    def __init__(self, request: Request, imds: str, now: Callable[[], float] = time.time) -> None:
        self._request = request
        self.imds = imds.rstrip("/")
        self._now = now
        self._creds: Optional[Credentials] = None
        self._next_try = 0.0
        self._lock = threading.Lock()
        self.fetches = 0  # credential documents read (a test's count)

    def get(self) -> Optional[Credentials]:
        now = self._now()
        with self._lock:
            creds = self._creds
            if creds is not None and creds.expires - now > REFRESH_BEFORE_S:
                return creds
            if now >= self._next_try:
                fresh, answered = self._fetch()
                if fresh is not None:
                    self._creds = creds = fresh
                else:
                    self._next_try = now + (RETRY_AFTER_S if answered else NO_IMDS_RETRY_S)
            return creds if creds is not None and creds.expires > now + 30 else None

    def _fetch(self) -> Tuple[Optional[Credentials], bool]:
        """(credentials or None, whether IMDS answered at all)."""
        tok = self._request(
            "PUT", f"{self.imds}/latest/api/token", [f"X-aws-ec2-metadata-token-ttl-seconds: {TOKEN_TTL_S}"], max_time=2
        )
        if not tok:
            return None, False
        auth = [f"X-aws-ec2-metadata-token: {tok.decode('ascii', 'replace').strip()}"]
        names = self._request("GET", self.imds + CREDS_PATH, auth, max_time=5)
        role = (names or b"").decode("utf-8", "replace").strip().splitlines()
        if not role or not role[0] or "/" in role[0]:
            return None, True
        body = self._request("GET", self.imds + CREDS_PATH + _q(role[0]), auth, max_time=5)
        self.fetches += 1
        return (parse_credentials(body) if body else None), True


class Signer:
    """Signs a presigned S3 URL's request with the node's own credentials, when it has them."""

    hides_missing = True  # S3 answers 403, not 404, for a missing object to a role without ListBucket

    def __init__(self, creds: ImdsCredentials, now: Callable[[], float] = time.time) -> None:
        self.creds = creds
        self._now = now

    def signed(self, method: str, url: str, region: Optional[str] = None) -> Optional[Tuple[str, List[str]]]:
        """(URL, headers) signed by the node, or None (not an S3 URL, or no credentials yet)."""
        region = region or scope_region(url)
        if not region:
            return None
        creds = self.creds.get()
        return sign(method, url, creds, region, self._now()) if creds is not None else None


def header_args(headers: Sequence[str]) -> List[str]:
    out: List[str] = []
    for h in headers:
        out += ["-H", h]
    return out


def post_target(url: str, fields: Sequence[Tuple[str, str]], key: str) -> Optional[Tuple[str, str]]:
    """A presigned POST's object as a PUT: (the object's URL, the region), or None (not SigV4 S3)."""
    region = None
    for name, value in fields:
        if name.lower() == "x-amz-credential":
            region = credential_region(value)
    if not region or not url.startswith(("http://", "https://")):
        return None
    return url.rstrip("/") + "/" + quote(key, safe="/-_.~"), region
