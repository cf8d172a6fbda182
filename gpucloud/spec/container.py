"""The job file's `container:` (docs/CONTAINERS.md): the image `setup` and `run` execute in, with
the engine options gpucloud leaves to the user. Checked when the file is loaded (syntax only; what
the registry says about the image is asked at plan time, gpucloud/plan/container.py).

An image reference follows docker's grammar: `[registry/]repository[:tag][@sha256:digest]`; the
first part names a registry when it holds a dot or a colon or is `localhost`, else the image is on
Docker Hub (`docker.io`, with `library/` for one-part names); no tag and no digest means `latest`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from gpucloud.spec.values import reject

DOCKER_HUB = "docker.io"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_HOST = re.compile(
    r"^(?:localhost|[A-Za-z0-9.-]+\.[A-Za-z0-9.-]+|[A-Za-z0-9.-]+:[0-9]+|\[[0-9a-fA-F:]+\](?::[0-9]+)?)$"
)
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_USER = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*(?::[A-Za-z0-9_.][A-Za-z0-9_.-]*)?$")

# Short engine options that take a value (`-v/a:/b`): in a cluster such as `-itv/a:/b` the letters
# after one of these are its value, not further options.
_VALUE_SHORT = frozenset("achlmpv")

# Engine options gpucloud sets itself: the user's would fight them (or leak env values into argv).
OWNED_OPTIONS: dict[str, str] = {
    "--rm": "gpucloud removes the container after each step",
    "--name": "gpucloud names the container after the run and node",
    "--network": "multi-node jobs need the host's network; gpucloud sets it",
    "--net": "multi-node jobs need the host's network; gpucloud sets it",
    "--gpus": "gpucloud gives the container every GPU of the node",
    "--env": "set variables in `env:` (or `secrets:` for tokens)",
    "-e": "set variables in `env:` (or `secrets:` for tokens)",
    "--env-file": "set variables in `env:` (or `secrets:` for tokens)",
    "--pull": "set `container.pull` (missing, always or never); gpucloud pulls before setup",
    "--detach": "gpucloud follows the step to its end",
    "-d": "gpucloud follows the step to its end",
    "--entrypoint": "use `container.entrypoint`",
    "--user": "use `container.user`",
    "-u": "use `container.user`",
    "--workdir": "the job runs in its own folder, mounted at the same path",
    "-w": "the job runs in its own folder, mounted at the same path",
}


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference; `name` is registry/repository as an engine pulls it."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    @property
    def reference(self) -> str:
        """What a registry's manifest endpoint takes: the digest if given, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        return f"{self.name}{tag}{'@' + self.digest if self.digest else ''}"


def parse_image_ref(ref: str) -> ImageRef:
    """docker's reference grammar; ValueError saying what is wrong, with the expected form."""
    text = ref.strip()
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"'{ref}' is not an image reference (no spaces; e.g. nvcr.io/nvidia/pytorch:24.08-py3)")
    if text.startswith("-"):
        raise ValueError(
            f"'{ref}' starts with '-', so the container engine would read it as one of its options, not an "
            "image. Write the image's name, e.g. nvcr.io/nvidia/pytorch:24.08-py3 (engine options go in "
            "container.options)"
        )
    rest, _, digest = text.partition("@")
    if digest and not _DIGEST.match(digest):
        raise ValueError(f"'{digest}' is not a digest. Expected @sha256: and 64 hex digits")
    first, slash, remainder = rest.partition("/")
    if slash and _HOST.match(first):  # a dot, a port, localhost or [IPv6]: a registry host
        registry, path = first, remainder
    else:
        registry, path = DOCKER_HUB, rest
    tag: str | None = None
    if ":" in path.rsplit("/", 1)[-1]:
        path, _, tag = path.rpartition(":")
        if not _TAG.match(tag):
            raise ValueError(
                f"'{tag}' is not an image tag (letters, digits, _ . -, at most 128, not starting with . or -)"
            )
    if not _REPOSITORY.match(path):
        raise ValueError(
            f"'{path}' is not a repository name: lower-case letters, digits and separators (. _ - /), "
            "e.g. nvidia/pytorch"
        )
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    return ImageRef(registry, path, tag if tag else (None if digest else "latest"), digest or None)


def _owned_flag(option: str) -> str:
    """The flag of `option` that gpucloud owns, else its flag as written: a short cluster hides one
    (`-eFOO=bar` is `-e FOO=bar`, `-itd` holds `-d`), as the engine would read it."""
    flag = option.split("=", 1)[0]
    if flag.startswith("--") or not flag.startswith("-"):
        return flag
    for letter in option[1:]:
        if f"-{letter}" in OWNED_OPTIONS:
            return f"-{letter}"
        if letter in _VALUE_SHORT or not letter.isalpha():
            break
    return flag


class ContainerLogin(BaseModel):
    """A registry login from one of the job's secrets (NGC: username `$oauthtoken`, the API key)."""

    model_config = ConfigDict(extra="forbid")
    username: str
    password_secret: str  # a name listed in `secrets:`; its value is the password or token
    registry: str | None = None  # default: the image's registry

    @field_validator("username")
    @classmethod
    def _username(cls, value: str) -> str:
        if not value.strip() or "\n" in value:
            reject("the registry user name is empty or has a line break. Write it as the registry shows it")
        return value

    @field_validator("registry")
    @classmethod
    def _registry(cls, value: str | None) -> str | None:
        """A registry host: it goes on the engine's login line, so never an option."""
        if value is not None and (value.startswith("-") or not (_HOST.match(value) or value == DOCKER_HUB)):
            reject(f"'{value}' is not a registry host. Expected e.g. nvcr.io or localhost:5000")
        return value


class ContainerSpec(BaseModel):
    """`container:`: a string is `{image: ...}`."""

    model_config = ConfigDict(extra="forbid")
    image: str
    options: list[str] = []
    user: str | None = None
    entrypoint: str | None = None
    login: ContainerLogin | None = None
    # missing: pull only when the machine lacks the image (a built or loaded `localhost/name:tag` runs);
    # always: pull every run; never: use the machine's image or fail. Default: missing on hosts you
    # own, always on a fresh cloud machine (docs/CONTAINERS.md, "Pull policy").
    pull: Literal["missing", "always", "never"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"image": value} if isinstance(value, str) else value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        try:
            parse_image_ref(value)
        except ValueError as exc:
            reject(str(exc))
        return value.strip()

    @field_validator("options")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        for option in value:
            flag = _owned_flag(option.strip())
            if flag in OWNED_OPTIONS:
                reject(f"'{option}' is set by gpucloud ({OWNED_OPTIONS[flag]}). Remove it from container.options")
            if flag.startswith("--device") and "nvidia.com/gpu" in option:
                reject(f"'{option}': gpucloud gives the container every GPU of the node. Remove it")
            if "\n" in option or "\0" in option:
                reject(f"'{option!r}' has a line break or NUL. Write one engine argument per list item")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not _USER.match(value):
            reject(f"'{value}' is not a user. Expected a name or uid, optionally :group, e.g. 1000:1000")
        return value

    @property
    def ref(self) -> ImageRef:
        return parse_image_ref(self.image)

    @property
    def registry(self) -> str:
        """The registry a login is for: login.registry, else the image's."""
        return self.login.registry if self.login and self.login.registry else self.ref.registry
