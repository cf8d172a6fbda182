"""The login a node uses to pull the job's container image, obtained here by the CLI and delivered
sealed to the node's key with its secrets (gpucloud/run/secrets.py): never in user-data, the state
store, a log or `--json` output (docs/CONTAINERS.md, "Private registries").

Where it comes from: `container.login` (a username and a password taken from `secrets:`), else, for
an image in a provider's container registry, the pull token its ImageLogin gets with the caller's
credentials (gpucloud/contract/services.py, found through the registry: ECR's lasts 12 hours, ACR's
about 3); it is asked again for a later seal when less than an hour is left (a spot restart hours
later). Public images need none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpucloud.contract import registry as providers
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
    """The job's pull logins, or None when its image needs none. With `check`, the image is looked up
    first where its registry can say (ECR: UserError naming it when ECR does not have it), before
    anything is launched."""
    container = getattr(spec, "container", None)
    if container is None:
        return None
    ref = parse_image_ref(container.image)
    login = container.login
    if login is not None:
        server = login.registry or ref.registry
        value = secret_values[login.password_secret]
        return PullLogins(lambda: PullLogin(server, login.username, value))
    image = providers.image_login(ref.registry, ref.repository, ref.tag, ref.digest)
    if image is None:
        return None
    where = f"container: {container.image}"
    if check:
        image.check(where)

    def make() -> PullLogin:
        user, password, expires = image.pull_token(where)
        return PullLogin(ref.registry, user, password, expires)

    logins = PullLogins(make)
    logins.current()  # the token is asked for now: a refusal stops the run before launch
    return logins


def policy_statements(spec: Any) -> list[dict[str, Any]]:
    """What the caller's IAM identity needs for the job's image (`iam-policy aws --data JOB`)."""
    container = getattr(spec, "container", None)
    if container is None or container.login is not None:
        return []
    ref = parse_image_ref(container.image)
    image = providers.image_login(ref.registry, ref.repository, ref.tag, ref.digest)
    return image.policy_statements() if image else []
