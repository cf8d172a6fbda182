"""The registry of providers: the one place that names the clouds.

Everything outside `gpucloud/providers/` (spec, planner, catalog, views, lifecycle, CLI) asks this
module which providers exist, what `any` means, whether a provider looks configured, and which
provider serves a capability (a check, a policy, an image store, a bucket scheme's DataStore, an
image registry's ImageLogin: gpucloud/contract/services.py); only the provider packages themselves
and data files spell a provider's name. Adding a provider is one package under providers/, one
entry in REGISTRY, and catalog rows (for priced providers).

Importing this module imports no cloud SDK: each "module:name" is imported when it is asked for.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucloud.contract.provider import Capabilities, CloudCheck, ImageStore, PlanRequest, Provider
    from gpucloud.contract.services import DataStore, ImageLogin


def _aws_configured() -> bool:
    """The standard boto3 chain has something to go on (keys, profile, files, web identity, endpoint)."""
    env = os.environ
    files = [
        Path(env.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")).expanduser(),
        Path(env.get("AWS_CONFIG_FILE", "~/.aws/config")).expanduser(),
    ]
    keys = (
        "AWS_ACCESS_KEY_ID",
        "AWS_PROFILE",
        "AWS_ENDPOINT_URL",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    )
    return any(k in env for k in keys) or any(p.is_file() for p in files)


def _azure_configured() -> bool:
    return any(k in os.environ for k in ("AZURE_SUBSCRIPTION_ID", "GPUCLOUD_AZURE_ARM_ENDPOINT"))


def _always() -> bool:
    return True


@dataclass(frozen=True)
class ProviderInfo:
    """One registry entry. `in_any`: part of what `cloud: any` expands to (machines you pay for
    on demand); `priced`: offerings come from the catalog (else the provider plans its own single
    candidate); `configured`: a cheap check, no SDK import, that credentials may be there."""

    name: str
    module: str
    class_name: str
    title: str
    in_any: bool
    priced: bool
    configured: Callable[[], bool]
    credentials_hint: str
    policy: str | None = None  # "module:function" returning the least-privilege policy document
    deadline_role: str | None = None  # "module:function(account, part)": the cloud-side deadline's role documents
    catalog_source: str | None = None  # module with fetch_offerings() for `catalog refresh`
    # "module:function(ctx)": the prices of the sizes already in the catalog from a public price
    # API, for `catalog refresh` without credentials.
    catalog_prices: str | None = None
    check: str | None = None  # "module:function" returning a base.CloudCheck (`gpucloud check`)
    # "module:function" that asks the cloud who the credentials are (one bounded call, before the
    # launch prompt): returns a one-line description, raises CloudAccessError when they do not work.
    identity: str | None = None
    image_store: str | None = None  # "module:Class" of its ImageStore (baked images, gpucloud/plan/baked.py)
    takes_hosts: bool = False  # the job names the machines (resources.hosts, --host); runs alone, never mixed
    takes_cluster: bool = False  # a batch scheduler (resources.cluster, partition, ...); runs alone, never mixed
    # The shape of this cloud's region names (a full-match regex): a name the catalog lacks that has
    # it is a region the catalog in use does not cover yet, not a typo (gpucloud/catalog/regions.py).
    region_pattern: str | None = None
    # "module:function(instance_type, spot) -> str": the network a multi-node run's nodes of that
    # type talk over ("EFA ×32", "InfiniBand", "TCP"), from shipped data, no SDK call (`plan`).
    fabric: str | None = None
    # The bucket scheme of its object store as a job's inputs/outputs ("s3" for s3://) and the
    # "module:Class" of its contract.services.DataStore (docs/DATA.md).
    bucket_scheme: str | None = None
    data_store: str | None = None
    # "module:function(registry, repository, tag, digest)" returning a contract.services.ImageLogin
    # for an image in its container registry, or None for any other image (docs/CONTAINERS.md).
    image_login: str | None = None
    # "module:function(dry, confirm, say) -> dict": `gpucloud setup CLOUD`, what the account needs once.
    setup: str | None = None
    # "module:function(asks, budget_s) -> list[dict]": the GPU quota of each candidate's family and
    # region, read before a launch (a lookup that fails is a note, never a refusal).
    quota: str | None = None
    # What the run's channel keeps after `down` and for how long ({run_id} filled in): `down` says it.
    channel_kept: str = ""
    # "module:function(hosts, asks) -> list of reports (problems, as_json(), render())": `hosts probe`.
    host_probe: str | None = None


REGISTRY: dict[str, ProviderInfo] = {
    info.name: info
    for info in (
        ProviderInfo(
            "aws",
            "gpucloud.providers.aws",
            "AwsProvider",
            "AWS",
            True,
            True,
            _aws_configured,
            "Configure the standard AWS credential chain (`aws configure`, AWS_PROFILE, or "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY).",
            policy="gpucloud.providers.aws.policy:policy_document",
            deadline_role="gpucloud.providers.aws.policy:role_documents",
            catalog_source="gpucloud.providers.aws.catalog",
            check="gpucloud.providers.aws.check:check",
            identity="gpucloud.providers.aws.check:identity",
            image_store="gpucloud.providers.aws.bake:AwsImageStore",
            fabric="gpucloud.providers.aws.efa:fabric",
            bucket_scheme="s3",
            data_store="gpucloud.providers.aws.services:S3Store",
            image_login="gpucloud.providers.aws.services:ecr_login",
            setup="gpucloud.providers.aws.setup:setup",
            quota="gpucloud.providers.aws.quota:verdicts",
            channel_kept=(
                "the run's code, agent, manifest and log objects stay in the channel bucket under "
                "runs/{run_id}/ for 30 days (the bucket's lifecycle rule), also for a run that never "
                "launched: `gpucloud logs {run_id}` still reads them"
            ),
            region_pattern=r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]+",  # us-east-1, ap-southeast-5, us-gov-west-1
        ),
        ProviderInfo(
            "azure",
            "gpucloud.providers.azure",
            "AzureProvider",
            "Azure",
            True,
            True,
            _azure_configured,
            "Run `az login` (or set AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET) and set "
            "AZURE_SUBSCRIPTION_ID.",
            catalog_source="gpucloud.providers.azure.catalog",
            catalog_prices="gpucloud.providers.azure.catalog:fetch_prices",
            image_store="gpucloud.providers.azure.bake:AzureImageStore",
            fabric="gpucloud.providers.azure.sizes:fabric",
            bucket_scheme="az",
            data_store="gpucloud.providers.azure.services:BlobStore",
            image_login="gpucloud.providers.azure.services:acr_login",
            setup="gpucloud.providers.azure.setup:setup",
            policy="gpucloud.providers.azure.rbac:policy_document",
            check="gpucloud.providers.azure.check:check",
            identity="gpucloud.providers.azure.check:identity",
            quota="gpucloud.providers.azure.quota:verdicts",
            region_pattern=r"[a-z][a-z0-9]{4,}",  # eastus, westus3, southeastasia: lower-case letters and digits
        ),
        ProviderInfo(
            "local",
            "gpucloud.providers.local.provider",
            "LocalProvider",
            "this machine",
            False,
            False,
            _always,
            "Nothing to configure.",
        ),
        ProviderInfo(
            "ssh",
            "gpucloud.providers.ssh.provider",
            "SshProvider",
            "your machines over SSH",
            False,
            False,
            _always,
            "Make `ssh HOST true` work without a prompt (key in the agent or IdentityFile in "
            "~/.ssh/config; GPUCLOUD_SSH_CONFIG names another config file).",
            takes_hosts=True,
            host_probe="gpucloud.providers.ssh.provider:probe_hosts",
        ),
        ProviderInfo(
            "slurm",
            "gpucloud.providers.slurm",
            "SlurmProvider",
            "a Slurm cluster",
            False,
            False,
            _always,
            "Make `ssh LOGIN sinfo` work without a prompt (or use cluster: local on a submit host); "
            "GPUCLOUD_SSH_CONFIG names another ssh config file.",
            takes_cluster=True,
        ),
    )
}


def names() -> tuple[str, ...]:
    """Every provider name, in registry order."""
    return tuple(REGISTRY)


def any_clouds() -> tuple[str, ...]:
    """What `cloud: any` expands to."""
    return tuple(n for n, info in REGISTRY.items() if info.in_any)


def priced_clouds() -> tuple[str, ...]:
    """Providers whose offerings and prices come from the catalog."""
    return tuple(n for n, info in REGISTRY.items() if info.priced)


def host_clouds() -> tuple[str, ...]:
    """Providers that run on machines the job names (`resources.hosts`, `--host`)."""
    return tuple(n for n, info in REGISTRY.items() if info.takes_hosts)


def cluster_clouds() -> tuple[str, ...]:
    """Providers that submit to a batch scheduler the job names (`resources.cluster`)."""
    return tuple(n for n, info in REGISTRY.items() if info.takes_cluster)


def info(name: str) -> ProviderInfo:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown cloud {name!r} (one of {', '.join(REGISTRY)})") from None


def configured_clouds() -> list[str]:
    """Priced clouds whose credentials or endpoints look configured, without importing their SDKs."""
    return [n for n in priced_clouds() if REGISTRY[n].configured()]


def get_provider(cloud: str, **kwargs: object) -> Provider:
    """Import the provider lazily: `gpucloud --help` must not import boto3 or azure."""
    return provider_class(cloud)(**kwargs)


def provider_class(cloud: str) -> type:
    """The provider's class, imported lazily (its module imports no cloud SDK at import time)."""
    entry = info(cloud)
    return getattr(importlib.import_module(entry.module), entry.class_name)


def capabilities(cloud: str) -> Capabilities:
    """What the provider declares about itself, without constructing it (no credentials needed)."""
    return provider_class(cloud).capabilities  # type: ignore[attr-defined]


def with_policy() -> tuple[str, ...]:
    """Providers that can print the least-privilege policy gpucloud needs (`gpucloud iam-policy`)."""
    return tuple(n for n, entry in REGISTRY.items() if entry.policy)


def with_check() -> tuple[str, ...]:
    """Providers `gpucloud check` can test (credentials, identity, regions, quotas)."""
    return tuple(n for n, entry in REGISTRY.items() if entry.check)


def with_setup() -> tuple[str, ...]:
    """Providers `gpucloud setup` can prepare (roles and policies an account needs once)."""
    return tuple(n for n, entry in REGISTRY.items() if entry.setup)


def _function(spec: str) -> Callable[..., Any]:
    module, func = spec.split(":")
    return getattr(importlib.import_module(module), func)


def run_setup(cloud: str, **kwargs: object) -> dict[str, Any]:
    """The provider's `setup` (imported lazily), as `gpucloud setup CLOUD` calls it."""
    spec = info(cloud).setup
    if not spec:
        raise ValueError(f"{cloud} has no setup")
    return dict(_function(spec)(**kwargs))


def quota_verdicts(cloud: str, asks: list[dict[str, object]], budget_s: float) -> list[dict[str, object]] | None:
    """Whether each ask fits the cloud's GPU quota (see ProviderInfo.quota); None for a cloud
    without quota lookups."""
    spec = info(cloud).quota
    if not spec:
        return None
    return list(_function(spec)(asks, budget_s))


def run_check(cloud: str) -> CloudCheck:
    """The provider's `check` (imported lazily: the SDK loads only for the cloud checked)."""
    entry = info(cloud)
    if not entry.check:
        raise ValueError(f"{cloud} has no check")
    module, func = entry.check.split(":")
    return getattr(importlib.import_module(module), func)()


def verify_identity(cloud: str) -> str | None:
    """Who the cloud's credentials are, asked of the cloud itself (imported lazily: the SDK loads
    only for the cloud asked); None for a provider without such a check (this machine, SSH hosts).
    Raises CloudAccessError when the credentials are refused or the endpoint does not answer; any
    other failure is not about the credentials, and the answer then says "not confirmed"."""
    entry = info(cloud)
    if not entry.identity:
        return None
    module, func = entry.identity.split(":")
    return str(getattr(importlib.import_module(module), func)())


def deadline_role_documents(cloud: str, account: str | None, part: str | None) -> dict[str, object]:
    """The documents of the role the cloud's scheduler uses for the deadline layer (c)
    (`gpucloud iam-policy CLOUD --deadline-role`); a UserError for a cloud without one."""
    from gpucloud.errors import UserError

    entry = info(cloud)
    if not entry.deadline_role:
        raise UserError(
            f"{cloud} has no deadline role: --deadline-role, --part and --account are for "
            f"{', '.join(n for n, e in REGISTRY.items() if e.deadline_role)}."
        )
    module, func = entry.deadline_role.split(":")
    return getattr(importlib.import_module(module), func)(account, part)


def fabric(cloud: str, instance_type: str, spot: bool) -> str | None:
    """The provider's fabric between a multi-node run's nodes of this type; None where the
    provider names none (imported lazily: only multi-node plans ask)."""
    entry = info(cloud)
    if not entry.fabric:
        return None
    module, func = entry.fabric.split(":")
    return str(getattr(importlib.import_module(module), func)(instance_type, spot))


def probe_hosts(cloud: str, hosts: list[str], asks: PlanRequest) -> list[Any]:
    """`hosts probe`: each host's GPUs, driver, OS and disk, judged for `asks`, by the host cloud's prober."""
    entry = info(cloud)
    if not entry.host_probe:
        raise ValueError(f"{cloud} has no host probe")
    module, func = entry.host_probe.split(":")
    return list(getattr(importlib.import_module(module), func)(hosts, asks))


def policy_document(cloud: str) -> dict[str, object]:
    """The provider's least-privilege policy document (imported lazily)."""
    entry = info(cloud)
    if not entry.policy:
        raise ValueError(f"{cloud} has no policy document")
    module, func = entry.policy.split(":")
    return getattr(importlib.import_module(module), func)()


def with_image_store() -> tuple[str, ...]:
    """Providers that can bake images (`gpucloud image build/ls/rm`)."""
    return tuple(n for n, entry in REGISTRY.items() if entry.image_store)


def image_store(cloud: str) -> ImageStore:
    """The provider's store of baked images (imported lazily; no SDK import until it is used)."""
    entry = info(cloud)
    if not entry.image_store:
        from gpucloud.errors import UserError

        raise UserError(
            f"{entry.title} has no baked images.", hint=f"Use --cloud with one of: {', '.join(with_image_store())}."
        )
    module, cls = entry.image_store.split(":")
    return getattr(importlib.import_module(module), cls)()


def _loaded(target: str) -> Any:
    """The attribute a "module:name" entry names (its module imported now, never at start-up)."""
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def bucket_provider(scheme: str) -> ProviderInfo | None:
    """The entry of the provider whose store serves a bucket scheme (its credentials reach it)."""
    return next((e for e in REGISTRY.values() if e.bucket_scheme == scheme and e.data_store), None)


def bucket_schemes() -> tuple[str, ...]:
    """The bucket schemes a provider's DataStore serves (`s3`, `az`)."""
    return tuple(e.bucket_scheme for e in REGISTRY.values() if e.bucket_scheme and e.data_store)


def data_store_class(scheme: str) -> type[DataStore] | None:
    """The DataStore class of a bucket scheme, or None where no provider serves it."""
    entry = bucket_provider(scheme)
    return _loaded(entry.data_store) if entry and entry.data_store else None


def data_store(scheme: str, account: str = "") -> DataStore | None:
    """The store for a bucket scheme (and account), or None where no provider serves the scheme."""
    cls = data_store_class(scheme)
    return cls(account) if cls else None


def bucket_credentials_found(scheme: str) -> bool:
    """Whether credentials for a bucket scheme's store look present here (environment and files, no
    SDK, no network): its provider's `configured`, or the store's own (a storage key)."""
    entry, cls = bucket_provider(scheme), data_store_class(scheme)
    return bool(entry and cls and (cls.credentials_found() or entry.configured()))


def image_login(registry: str, repository: str, tag: str | None, digest: str | None) -> ImageLogin | None:
    """The pull login of an image in a provider's container registry; None for any other image."""
    for entry in REGISTRY.values():
        if entry.image_login:
            login = _loaded(entry.image_login)(registry, repository, tag, digest)
            if login is not None:
                return login
    return None
