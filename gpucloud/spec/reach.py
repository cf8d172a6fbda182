"""What a job file may reach on the caller's machine by itself (docs/SECURITY.md, "A job file from
someone else").

A job file names secrets (whose values come from the caller's environment) and local inputs (files
the caller's machine uploads). In CI the job file may come from a pull request: written by a
stranger, run with the pipeline's cloud credentials in the environment and its home folder on disk.
So a job file alone may not name a cloud or CI credential variable as a secret, nor a local input
outside its own folder tree (symlinks followed) or in a place that holds credentials; the caller
allows one on the command line (`--allow-secret NAME`, `--allow-input PATH`), never the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucloud.spec.data import input_source, parse_location
from gpucloud.spec.values import SpecIssue

if TYPE_CHECKING:
    from gpucloud.spec.errors import KeyLines
    from gpucloud.spec.models import JobSpec

_KEYS = "a cloud account's keys"
_TOKEN_FILE = "the path of a federated token that signs in to a cloud account"
_CI_TOKEN = "a token of the CI system itself (it can push code, read secrets or sign in to clouds)"

# Environment variables that sign in to a cloud or CI system. A job file naming one as a secret
# would copy it from the CI's environment onto a machine the job file controls.
CREDENTIAL_SECRETS: dict[str, str] = {
    "AWS_ACCESS_KEY_ID": _KEYS,
    "AWS_SECRET_ACCESS_KEY": _KEYS,
    "AWS_SESSION_TOKEN": "a temporary session of a cloud account",
    "AWS_SECURITY_TOKEN": "a temporary session of a cloud account (the older name)",
    "AWS_WEB_IDENTITY_TOKEN_FILE": _TOKEN_FILE,
    "AWS_CONTAINER_CREDENTIALS_FULL_URI": "the address that serves a container's cloud credentials",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN": "the token that reads the container's cloud credentials",
    "AZURE_CLIENT_SECRET": "a service principal's password",
    "AZURE_CLIENT_CERTIFICATE_PASSWORD": "a service principal's certificate password",
    "AZURE_CLIENT_CERTIFICATE_PATH": "a service principal's certificate",
    "AZURE_FEDERATED_TOKEN_FILE": _TOKEN_FILE,
    "AZURE_PASSWORD": "a cloud account's password",
    "AZURE_STORAGE_KEY": "a storage account's key",
    "AZURE_STORAGE_CONNECTION_STRING": "a storage account's key",
    "AZURE_STORAGE_SAS_TOKEN": "a storage account's access grant",
    "ARM_CLIENT_SECRET": "a service principal's password",
    "ARM_CLIENT_CERTIFICATE_PASSWORD": "a service principal's certificate password",
    "ARM_ACCESS_KEY": "a storage account's key",
    "ARM_OIDC_TOKEN": "a federated token that signs in to a cloud account",
    "GOOGLE_APPLICATION_CREDENTIALS": "a service account's key file",
    "GOOGLE_CREDENTIALS": "a service account's key",
    "GOOGLE_OAUTH_ACCESS_TOKEN": "a cloud account's access token",
    "CLOUDSDK_AUTH_ACCESS_TOKEN": "a cloud account's access token",
    "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "the token that mints OIDC tokens, which sign in to clouds",
    "ACTIONS_ID_TOKEN_REQUEST_URL": "the address that mints OIDC tokens, which sign in to clouds",
    "ACTIONS_RUNTIME_TOKEN": _CI_TOKEN,
    "GITHUB_TOKEN": _CI_TOKEN,
    "GH_TOKEN": _CI_TOKEN,
    "CI_JOB_TOKEN": _CI_TOKEN,
    "CI_JOB_JWT": _CI_TOKEN,
    "CI_JOB_JWT_V2": _CI_TOKEN,
    "CI_REGISTRY_PASSWORD": _CI_TOKEN,
    "SYSTEM_ACCESSTOKEN": _CI_TOKEN,
    "BUILDKITE_AGENT_ACCESS_TOKEN": _CI_TOKEN,
}

# Folders of the caller's machine that hold credentials or the kernel's view of its processes
# (/proc/self/environ is the CLI's whole environment). Home-relative ones are joined to the home.
SYSTEM_PLACES = ("/proc", "/sys", "/dev", "/run/secrets", "/var/run/secrets")
HOME_PLACES = (
    ".aws",
    ".azure",
    ".ssh",
    ".config/gcloud",
    ".config/gh",
    ".docker",
    ".kube",
    ".gnupg",
    ".netrc",
    ".git-credentials",
)
# Environment variables that move those places elsewhere.
PLACE_VARIABLES = ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AZURE_CONFIG_DIR", "CLOUDSDK_CONFIG")


@dataclass(frozen=True)
class Allowances:
    """What the caller allowed on the command line: secret names and local paths (resolved)."""

    secrets: frozenset[str] = frozenset()
    inputs: tuple[Path, ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, secrets: Iterable[str] = (), inputs: Iterable[str] = ()) -> Allowances:
        return cls(frozenset(s.strip() for s in secrets), tuple(_resolved(Path(p).expanduser()) for p in inputs))

    def allows_path(self, path: Path) -> bool:
        return any(path == allowed or allowed in path.parents for allowed in self.inputs)


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: judged by its own name
        return Path(os.path.abspath(path))


def credential_places(environ: dict[str, str] | None = None) -> list[Path]:
    """Every place a job file's input may not be in nor contain (resolved)."""
    env = dict(os.environ) if environ is None else environ
    home = Path(env.get("HOME") or Path.home())
    places = [Path(p) for p in SYSTEM_PLACES] + [home / p for p in HOME_PLACES]
    places += [Path(env[v]).expanduser() for v in PLACE_VARIABLES if env.get(v)]
    if env.get("GPUCLOUD_HOME"):
        places.append(Path(env["GPUCLOUD_HOME"]).expanduser())
    else:  # state/home.py's default, without creating it (a check makes nothing)
        import platformdirs

        places.append(Path(platformdirs.user_data_dir("gpucloud")))
    return [_resolved(p) for p in places]


def _secret_issue(name: str, filename: str, line: int | None) -> SpecIssue:
    return SpecIssue(
        filename,
        line,
        "secrets",
        f"{name} holds {CREDENTIAL_SECRETS[name.upper()]}: a job file may not ask for it by itself, or a job "
        "file from a pull request would carry the caller's credentials to a machine it controls. If this "
        f"job is yours and needs it, pass --allow-secret {name}",
    )


def _place_problem(path: Path, base: Path, places: list[Path], *, holding: bool = True) -> str | None:
    """Why `path` may not be uploaded, or None. `holding`: a folder that holds a credentials place is a
    problem too (a copied input); a workdir is packed without them (channel/workdir.py `skip`)."""
    for place in places:
        if path == place:
            return f"is {path} (symlinks followed), which holds credentials"
        if place in path.parents:
            return f"is {path} (symlinks followed), inside {place}, which holds credentials"
        if holding and path in place.parents and place.exists():
            return f"is {path} (symlinks followed), which holds {place}, a place with credentials"
    if path != base and base not in path.parents:
        return f"is {path} (symlinks followed), outside the job file's folder {base}"
    return None


def _workdir_issues(
    spec: JobSpec,
    base: Path,
    filename: str,
    lines: dict[tuple[Any, ...], KeyLines],
    allow: Allowances,
    places: list[Path],
) -> list[SpecIssue]:
    """`workdir` may lead up (`..`, a monorepo), but not into a credentials place; one inside it is
    left out of the upload (channel/workdir.py `skip`), so `workdir: ..` holding GPUCLOUD_HOME works."""
    path = _resolved(base / spec.workdir)  # as JobSpec.workdir_path reads it: no `~`
    problem = _place_problem(path, path, places, holding=False)
    if not problem or allow.allows_path(path):
        return []
    where = lines.get(("workdir",))
    return [
        SpecIssue(
            filename,
            where.value_line if where else None,
            "workdir",
            f"'{spec.workdir}' {problem}. It is uploaded whole, so a job file may not point it there by "
            f"itself. Point workdir at the project's own folder, or if this job is yours pass --allow-input {path}",
        )
    ]


def reach_issues(
    spec: JobSpec,
    base_dir: Path,
    filename: str,
    lines: dict[tuple[Any, ...], KeyLines],
    allow: Allowances | None = None,
) -> list[SpecIssue]:
    """Each secret and local input the job file names that it may not reach by itself."""
    allow = allow or Allowances()
    issues: list[SpecIssue] = []
    for i, name in enumerate(spec.secrets):
        if name.upper() in CREDENTIAL_SECRETS and name not in allow.secrets:
            where = lines.get(("secrets", i)) or lines.get(("secrets",))
            issues.append(_secret_issue(name, filename, where.value_line if where else None))
    base = _resolved(base_dir)
    places = credential_places()
    issues.extend(_workdir_issues(spec, base, filename, lines, allow, places))
    for dest, value in spec.inputs.items():
        text, _mode = input_source(value)
        source = parse_location(text)
        if source.kind != "path":
            continue
        path = _resolved(base / source.url)  # as data_grants reads it: no `~` expansion
        if allow.allows_path(path):
            continue
        problem = _place_problem(path, base, places)
        if problem:
            where = lines.get(("inputs", dest))
            issues.append(
                SpecIssue(
                    filename,
                    where.value_line if where else None,
                    f"inputs.{dest}",
                    f"the local source '{source.url}' {problem}. A job file may not upload it by itself, or "
                    "a job file from a pull request could copy the caller's files to a machine it controls. "
                    f"Move the data into the job file's folder, or if this job is yours pass --allow-input {path}",
                )
            )
    return issues
