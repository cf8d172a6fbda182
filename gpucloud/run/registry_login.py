"""The login a node uses to pull the job's container image, obtained here by the CLI and delivered
sealed to the node's key with its secrets (gpucloud/run/secrets.py): never in user-data, the state
store, a log or `--json` output (docs/CONTAINERS.md, "Private registries").

Where it comes from: `container.login` (a username and a password taken from `secrets:`), else, for
an image in Amazon ECR, a pull token the CLI asks ECR for with the caller's credentials (12 hours),
or for Azure Container Registry a refresh token exchanged for the caller's Entra ID token (about 3
hours); either is asked again for a later seal when less than an hour is left (a spot restart hours
later). Public images need none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpucloud.spec.container import parse_image_ref

REFRESH_BEFORE_S = 3600.0


@dataclass(frozen=True)
class PullLogin:
    server: str
    username: str
    password: str = field(repr=False)
    expires_at: float | None = None

    def sealed(self) -> dict[str, str]:
        """The sealed document's `registry` entry."""
        return {"server": self.server, "username": self.username, "password": self.password}


class PullLogins:
    """The job's pull login, made when first asked and again when it is about to run out."""

    def __init__(self, make: Callable[[], PullLogin], now: Callable[[], float] = time.time) -> None:
        self._make, self._now = make, now
        self._login: PullLogin | None = None

    def current(self) -> dict[str, str]:
        login = self._login
        if login is None or (login.expires_at is not None and login.expires_at - self._now() < REFRESH_BEFORE_S):
            login = self._login = self._make()
        return login.sealed()


def pull_logins(spec: Any, secret_values: Mapping[str, str], *, check: bool = True) -> PullLogins | None:
    """The job's pull logins, or None when its image needs none. With `check`, an ECR image is looked
    up first (UserError naming it when ECR does not have it), before anything is launched."""
    container = getattr(spec, "container", None)
    if container is None:
        return None
    ref = parse_image_ref(container.image)
    login = container.login
    if login is not None:
        server = login.registry or ref.registry
        value = secret_values[login.password_secret]
        return PullLogins(lambda: PullLogin(server, login.username, value))
    from gpucloud.providers.azure.acr import is_acr

    if is_acr(ref.registry):
        return _acr_logins(ref.registry, f"container: {container.image}")
    from gpucloud.providers.aws.ecr import check_image, ecr_image, pull_token

    ecr = ecr_image(ref.registry, ref.repository, ref.tag, ref.digest)
    if ecr is None:
        return None
    if check:
        check_image(ecr, f"container: {container.image}")

    def make() -> PullLogin:
        user, password, expires = pull_token(ecr)
        return PullLogin(ref.registry, user, password, expires)

    logins = PullLogins(make)
    logins.current()  # the token is asked for now: a refusal stops the run before launch
    return logins


def _acr_logins(registry: str, where: str) -> PullLogins:
    from gpucloud.providers.azure.acr import pull_token

    def make() -> PullLogin:
        user, password, expires = pull_token(registry, where)
        return PullLogin(registry, user, password, expires)

    logins = PullLogins(make)
    logins.current()  # exchanged now: no credentials or no AcrPull stops the run before launch
    return logins


def policy_statements(spec: Any) -> list[dict[str, Any]]:
    """What the caller's IAM identity needs for the job's image (`iam-policy aws --data JOB`)."""
    container = getattr(spec, "container", None)
    if container is None or container.login is not None:
        return []
    from gpucloud.providers.aws.ecr import ecr_image
    from gpucloud.providers.aws.ecr import policy_statements as ecr_statements

    ref = parse_image_ref(container.image)
    ecr = ecr_image(ref.registry, ref.repository, ref.tag, ref.digest)
    return ecr_statements([ecr] if ecr else [])
