"""What an image's registry says about it: the image config (Env, Labels) read over the OCI
distribution API v2, so that `plan` can tell which CUDA a `container:` image was built for.

The plan path is speed-sensitive and offline-tolerant, so this never raises and never waits long:
the whole lookup runs under one time budget (3 s), and any failure -- no network, a timeout, a
registry that wants a login gpucloud does not have, a manifest kind it does not read -- is an
`Unknown` with the reason, which the plan turns into a warning. Stdlib only (urllib), imported
only when a job has `container:`.

The protocol (OCI distribution spec; docker's registry API v2): GET /v2/<repo>/manifests/<ref>
with Accept naming the OCI index/manifest and docker manifest list/v2 types; an index is resolved to
its linux/amd64 manifest; the manifest's config descriptor names a blob, GET /v2/<repo>/blobs/<digest>,
whose `config.Env` and `config.Labels` carry NVIDIA's CUDA_VERSION / com.nvidia.cuda.version. A 401
with `WWW-Authenticate: Bearer realm=...,service=...,scope=...` is answered with an anonymous token
from the realm (or one bought with the job's login); `Basic` is answered only with a login.
Endpoints are https, except a registry on this machine (localhost, 127.0.0.1, [::1]): plain http.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucloud.spec.container import ImageRef

BUDGET_S = 3.0
MAX_DOCUMENT = 4 * 1024 * 1024  # a manifest or config above this is not an image config worth reading
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEXES = (OCI_INDEX, DOCKER_LIST)
MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
# Docker Hub's name in references is docker.io; its API answers on registry-1.docker.io [K: docker's
# distribution reference and the engine's default endpoint].
ENDPOINTS = {"docker.io": "registry-1.docker.io"}
USER_AGENT = "gpucloud-plan (image config lookup)"
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
_CUDA = re.compile(r"^\s*(\d{1,2})\.(\d{1,2})(?:\.\d+)*")
_REQUIRE_CUDA = re.compile(r"cuda>=(\d{1,2})\.(\d{1,2})")


@dataclass(frozen=True)
class ImageConfig:
    """The image config's environment and labels, and the manifest it came from."""

    env: dict[str, str]
    labels: dict[str, str]
    manifest_digest: str = ""
    size_bytes: int = 0  # what a pull downloads: the manifest's layers and config (0: not said)
    cuda: str | None = field(init=False)  # "12.4": the CUDA it was built for, if the config says
    cuda_detail: str = field(init=False)  # where that was read

    def __post_init__(self) -> None:
        cuda, detail = cuda_of(self.env, self.labels)
        object.__setattr__(self, "cuda", cuda)
        object.__setattr__(self, "cuda_detail", detail)


@dataclass(frozen=True)
class Unknown:
    """The registry could not be asked or did not answer in time; `reason` says which."""

    reason: str


def cuda_of(env: Mapping[str, str], labels: Mapping[str, str]) -> tuple[str | None, str]:
    """(major.minor, where it was read) from NVIDIA's conventions: CUDA_VERSION in the environment
    (nvidia/cuda and NGC images), the com.nvidia.cuda.version label, NVIDIA_REQUIRE_CUDA's `cuda>=X.Y`."""
    for where, value in (
        ("CUDA_VERSION in the image's environment", env.get("CUDA_VERSION", "")),
        ("the image's com.nvidia.cuda.version label", labels.get("com.nvidia.cuda.version", "")),
    ):
        hit = _CUDA.match(value)
        if hit:
            return f"{int(hit.group(1))}.{int(hit.group(2))}", f"{where} ({value.strip()})"
    hit = _REQUIRE_CUDA.search(env.get("NVIDIA_REQUIRE_CUDA", ""))
    if hit:
        return f"{int(hit.group(1))}.{int(hit.group(2))}", "NVIDIA_REQUIRE_CUDA in the image's environment"
    return None, "the image's config names no CUDA version (no CUDA_VERSION, no com.nvidia.cuda.version label)"


def endpoint(registry: str) -> str:
    """The API base for a registry host: http for this machine, https otherwise."""
    host = ENDPOINTS.get(registry, registry)
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    return f"{'http' if name in LOCAL_HOSTS else 'https'}://{host}"


def read_config(
    ref: ImageRef,
    *,
    login: tuple[str, str] | None = None,
    budget_s: float = BUDGET_S,
    platform: tuple[str, str] = ("linux", "amd64"),
) -> ImageConfig | Unknown:
    """The image's config as its registry serves it, or Unknown with the reason; never raises and
    returns within `budget_s` (the lookup runs in a daemon thread that is left to its own timeouts)."""
    result: list[ImageConfig | Unknown] = []
    session = _Session(ref, login, time.monotonic() + budget_s, platform)

    def work() -> None:
        try:
            result.append(session.config())
        except _Stop as stop:
            result.append(Unknown(stop.reason))
        except Exception as exc:  # noqa: BLE001 - any failure is an answer, never a traceback in `plan`
            result.append(Unknown(f"unexpected {type(exc).__name__}: {exc}"))

    thread = threading.Thread(target=work, name="registry-lookup", daemon=True)
    thread.start()
    thread.join(budget_s)
    if not result:
        return Unknown(f"{ref.registry} did not answer within {budget_s:g} s")
    return result[0]


class _Stop(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Session:
    """One lookup: the auth it has earned so far and the deadline every request shares."""

    def __init__(
        self, ref: ImageRef, login: tuple[str, str] | None, deadline: float, platform: tuple[str, str]
    ) -> None:
        self.ref, self.login, self.deadline, self.platform = ref, login, deadline, platform
        self.base = endpoint(ref.registry)
        self.auth = ""  # the Authorization value that worked (or was bought)
        self.tried_auth = False

    def config(self) -> ImageConfig:
        doc, digest = self._manifest(self.ref.reference)
        kind = doc.get("mediaType", "")
        if kind in INDEXES or "manifests" in doc:
            doc, digest = self._manifest(self._platform_digest(doc))
            kind = doc.get("mediaType", "")
        if kind not in MANIFESTS and not isinstance(doc.get("config"), dict):
            raise _Stop(f"the registry sent a {kind or 'schema 1'} manifest, which gpucloud does not read")
        blob = str(doc["config"].get("digest", ""))
        body, _ = self._get(f"/v2/{self.ref.repository}/blobs/{blob}", "*/*")
        _check_digest(body, blob, "config")
        config = _json(body, "config").get("config") or {}
        env = dict(item.split("=", 1) for item in config.get("Env") or [] if isinstance(item, str) and "=" in item)
        labels = {str(k): str(v) for k, v in (config.get("Labels") or {}).items()}
        return ImageConfig(env=env, labels=labels, manifest_digest=digest, size_bytes=pull_size(doc))

    def _manifest(self, reference: str) -> tuple[dict[str, Any], str]:
        accept = ", ".join((*INDEXES, *MANIFESTS))
        body, headers = self._get(f"/v2/{self.ref.repository}/manifests/{reference}", accept)
        digest = headers.get("Docker-Content-Digest", "")
        if reference.startswith("sha256:"):
            _check_digest(body, reference, "manifest")
            digest = reference
        doc = _json(body, "manifest")
        if "mediaType" not in doc and headers.get("Content-Type"):
            doc["mediaType"] = headers["Content-Type"].split(";")[0].strip()
        return doc, digest

    def _platform_digest(self, index: dict[str, Any]) -> str:
        want_os, want_arch = self.platform
        for item in index.get("manifests") or []:
            plat = item.get("platform") or {}
            if plat.get("os") == want_os and plat.get("architecture") == want_arch:
                return str(item.get("digest", ""))
        raise _Stop(f"the image index has no {want_os}/{want_arch} image")

    def _timeout(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Stop(f"{self.ref.registry} did not answer in time")
        return left

    def _get(self, path: str, accept: str) -> tuple[bytes, Mapping[str, str]]:
        """GET base+path; a 401 is answered once (token or login) and the request repeated."""
        for _ in range(2):
            request = urllib.request.Request(self.base + path, headers={"Accept": accept, "User-Agent": USER_AGENT})
            if self.auth:  # not sent on to a redirect's host (blob storage behind the registry)
                request.add_unredirected_header("Authorization", self.auth)
            try:
                with urllib.request.urlopen(request, timeout=self._timeout()) as response:
                    return _read(response), response.headers
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and not self.tried_auth:
                    self.tried_auth = True
                    self.auth = self._answer(exc.headers.get("WWW-Authenticate", ""))
                    continue
                raise _Stop(_http_reason(exc.code, self.ref, bool(self.login))) from None
            except (urllib.error.URLError, OSError) as exc:
                raise _Stop(f"{self.ref.registry} could not be reached ({_why(exc)})") from None
        raise _Stop(_http_reason(401, self.ref, bool(self.login)))

    def _answer(self, challenge: str) -> str:
        """The Authorization value for a 401's challenge, or _Stop when there is none to give."""
        scheme, _, rest = challenge.strip().partition(" ")
        if scheme.lower() == "basic":
            if self.login is None:
                raise _Stop(f"{self.ref.registry} asks for a login (basic auth) and the job gives none")
            return "Basic " + base64.b64encode(f"{self.login[0]}:{self.login[1]}".encode()).decode()
        if scheme.lower() != "bearer":
            raise _Stop(f"{self.ref.registry} asks for {scheme or 'an unnamed'} auth, which gpucloud does not speak")
        params = dict(_CHALLENGE_PARAM.findall(rest))
        realm = params.get("realm", "")
        parts = urllib.parse.urlsplit(realm)
        if parts.scheme != "https" and not (parts.scheme == "http" and parts.hostname in ("localhost", "127.0.0.1")):
            raise _Stop(f"{self.ref.registry}'s token service {realm!r} is not https")
        query = {"service": params.get("service", "")}
        query["scope"] = params.get("scope") or f"repository:{self.ref.repository}:pull"
        url = realm + ("&" if parts.query else "?") + urllib.parse.urlencode({k: v for k, v in query.items() if v})
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
        if self.login is not None:
            basic = base64.b64encode(f"{self.login[0]}:{self.login[1]}".encode()).decode()
            request.add_unredirected_header("Authorization", "Basic " + basic)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout()) as response:
                doc = _json(_read(response), "token")
        except urllib.error.HTTPError as exc:
            raise _Stop(_http_reason(exc.code, self.ref, bool(self.login), what="token")) from None
        except (urllib.error.URLError, OSError) as exc:
            raise _Stop(f"the token service of {self.ref.registry} could not be reached ({_why(exc)})") from None
        token = doc.get("token") or doc.get("access_token")
        if not isinstance(token, str) or not token:
            raise _Stop(f"the token service of {self.ref.registry} sent no token")
        return f"Bearer {token}"


def pull_size(manifest: dict[str, Any]) -> int:
    """The bytes a pull downloads, as the manifest declares them (its layers and its config); 0 when
    a size is missing or not a count (the agent then bounds the pull by the run's deadline only)."""
    parts = [*(manifest.get("layers") or []), manifest.get("config") or {}]
    sizes = [p.get("size") if isinstance(p, dict) else None for p in parts]
    counts = [n for n in sizes if isinstance(n, int) and not isinstance(n, bool) and n >= 0]
    return sum(counts) if counts and len(counts) == len(sizes) else 0


def _read(response: Any) -> bytes:
    body: bytes = response.read(MAX_DOCUMENT + 1)
    if len(body) > MAX_DOCUMENT:
        raise _Stop(f"the registry sent more than {MAX_DOCUMENT // (1024 * 1024)} MiB for one document")
    return body


def _json(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        raise _Stop(f"the registry's {what} is not JSON") from None
    if not isinstance(doc, dict):
        raise _Stop(f"the registry's {what} is not a JSON object")
    return doc


def _check_digest(body: bytes, digest: str, what: str) -> None:
    algorithm, _, want = digest.partition(":")
    if algorithm != "sha256" or hashlib.sha256(body).hexdigest() != want:
        raise _Stop(f"the {what} the registry sent does not match its digest {digest[:19]}...")


def _http_reason(code: int, ref: ImageRef, has_login: bool, what: str = "image") -> str:
    if code in (401, 403):
        login = "the job's login was refused" if has_login else "it needs a login the job does not give"
        return f"{ref.registry} refused to show the {what} (HTTP {code}: {login})"
    if code == 404:
        return f"{ref.registry} has no {ref.repository}:{ref.reference} (HTTP 404)"
    if code == 429:
        return f"{ref.registry} is rate-limiting this machine (HTTP 429)"
    return f"{ref.registry} answered HTTP {code}"


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason if reason is not None else exc) or type(exc).__name__
