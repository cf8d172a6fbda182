"""The capability services a run asks of a cloud, found through the registry by what the job names
(a bucket scheme, an image's registry), never by the cloud's name in run/, vm/ or plan/; and the
optional provider methods, declared on the contract with defaults."""

from __future__ import annotations

from gpucloud.contract import registry as providers
from gpucloud.contract.provider import Provider, RunHandle
from gpucloud.plan.stacks import resolve_stack


def test_a_bucket_scheme_finds_its_providers_store() -> None:
    assert set(providers.bucket_schemes()) == {"s3", "az"}
    s3, blob = providers.data_store("s3"), providers.data_store("az", "acct")
    assert type(s3).__name__ == "S3Store" and type(blob).__name__ == "BlobStore"
    assert blob is not None and blob.account == "acct"
    assert providers.data_store("https") is None and providers.data_store("path") is None
    entry = providers.bucket_provider("az")
    assert entry is not None and entry.title == "Azure"


def test_an_image_finds_its_registrys_login() -> None:
    ecr = providers.image_login("123456789012.dkr.ecr.us-east-1.amazonaws.com", "team/train", "v1", None)
    acr = providers.image_login("myregistry.azurecr.io", "team/train", "v1", None)
    assert ecr is not None and acr is not None
    assert type(ecr).__name__ == "EcrLogin" and type(acr).__name__ == "AcrLogin"
    assert providers.image_login("docker.io", "library/python", "3.11", None) is None
    assert acr.policy_statements() == [] and ecr.policy_statements()  # IAM statements only where IAM grants it


def test_optional_provider_methods_have_defaults() -> None:
    class Bare(Provider):  # implements nothing optional
        name = "bare"

    stack = resolve_stack("T4")
    bare = Bare()  # type: ignore[abstract]
    assert bare.plan_stack(stack) is stack and bare.plan_notes() == []
    bare.stop(RunHandle(run_id="r", cloud="bare", region="here"))  # nothing to stop, no error
