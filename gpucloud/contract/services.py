"""The capability services a provider may offer the core besides machines, found through the
registry (gpucloud/contract/registry.py), so that run/, vm/ and plan/ ask for a capability and
never name the cloud that has it.

- `DataStore`: a cloud's buckets as a job's `inputs:`/`outputs:` (docs/DATA.md): listing and
  checking from the caller, and the node's grants (GET URLs, a mount credential, a write grant),
  each expiring at the run's deadline. A provider entry names its bucket scheme (`s3`, `az`) and
  the class; `run/data_grants.py` talks to that class only.
- `ImageLogin`: a container registry whose pull token the CLI gets with the caller's cloud
  credentials (docs/CONTAINERS.md, "Private registries"); `run/pull_login.py` seals it.

Both are plain classes with defaults: a cloud implements what it has, and a call to a capability
it lacks is answered by the default (no limit, no policy statements, nothing to check)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

Files = list[tuple[str, int, str]]  # (path under the input, size, key / URL)
Statements = list[dict[str, Any]]  # IAM policy statements (the caller's identity needs them)


class DataStore:
    """One bucket kind's store, for one account (`az://ACCOUNT/...`; empty where the scheme has none).
    `where` names the job-file field in every error (`inputs.data`)."""

    def __init__(self, account: str = "") -> None:
        self.account = account

    @classmethod
    def credentials_found(cls) -> bool:
        """Credentials for the store itself beyond its provider's `configured` (a storage key);
        looked up without an SDK or the network."""
        return False

    @classmethod
    def mount_limit(cls, max_duration: int, where: str) -> None:
        """Refuse, from the job file alone, a mounted input longer than the store's credentials last."""

    @classmethod
    def grant_life_s(cls, cloud: str) -> int | None:
        """How long a grant the caller makes for a node of `cloud` (a URL, a SAS, a POST policy) can
        last at most; None when such a node reaches the store under its own identity instead."""
        return None

    @classmethod
    def node_mounts(cls, cloud: str) -> bool:
        """Whether machines of `cloud` mount this store's folders under their own identity (no
        credential made by the caller, so none of its limits: its kind, its life)."""
        return False

    @classmethod
    def policy_statements(
        cls, reads: list[tuple[str, str]], writes: list[tuple[str, str]], mounts: list[tuple[str, str]]
    ) -> Statements:
        """What the caller's identity needs for these (bucket, prefix) reads, writes and mounts."""
        return []

    def list_input(self, bucket: str, prefix: str, where: str) -> tuple[str, Files]:
        """The bucket's region ("" where it has none) and the files under prefix."""
        raise NotImplementedError

    def check_output(self, bucket: str, where: str) -> str:
        """The output bucket exists and is reachable: its region ("" where it has none)."""
        raise NotImplementedError

    def check_mount(self, bucket: str, prefix: str, where: str) -> str:
        """A mounted folder's bucket and objects, and that a mount credential can be had: its region."""
        raise NotImplementedError

    def check_node_mount(self, bucket: str, prefix: str, where: str) -> str:
        """`check_mount` for nodes that mount under their own identity: no mount credential asked."""
        return self.check_mount(bucket, prefix, where)

    def input_urls(self, bucket: str, region: str, keys: list[str], expires: datetime) -> list[str]:
        """One GET URL per key, expiring at `expires`."""
        raise NotImplementedError

    def output_grant(self, bucket: str, region: str, prefix: str, expires: datetime) -> dict[str, Any]:
        """A write-only grant under prefix, expiring at `expires`."""
        raise NotImplementedError

    def mount_grant(
        self, bucket: str, prefix: str, region: str, run_id: str, expires: datetime, where: str
    ) -> dict[str, Any]:
        """A read/list credential for the folder, expiring at `expires` (one per run, its nodes share it)."""
        raise NotImplementedError

    def node_mount_grant(self, bucket: str, prefix: str, region: str) -> dict[str, Any]:
        """The mount of a node admitted to the folder (`admit_node`): where, and no secret."""
        raise NotImplementedError

    def admit_node(
        self,
        handle: Any,
        reads: list[tuple[str, str]],
        writes: list[tuple[str, str]],
        mounts: list[tuple[str, str]],
    ) -> str:
        """Let the attempt's nodes reach these (bucket, prefix) reads, writes and mounts under their
        own identity, where `handle` (a RunHandle) holds one of this cloud's; a problem line, or ""."""
        return ""


class ImageLogin:
    """A container image in a registry whose pull token comes from the caller's cloud credentials."""

    def check(self, where: str) -> None:
        """Refuse before launch an image the registry does not have (where that can be asked)."""

    def pull_token(self, where: str) -> tuple[str, str, float | None]:
        """(username, password, expiry as a UNIX time or None)."""
        raise NotImplementedError

    def policy_statements(self) -> Statements:
        """What the caller's identity needs to pull the image."""
        return []
