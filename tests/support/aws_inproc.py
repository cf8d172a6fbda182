"""The AWS provider in this process against moto: the botocore test hooks installed (faults, the
operation recorder), a provider with its waits shortened, and a journal in the test's state store."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.aws_faults import HOOKS, AwsHooks, install
from tests.support.moto_server import Moto


@pytest.fixture
def hooks(moto: Moto) -> Iterator[AwsHooks]:
    """The hooks installed and cleared, and the provider's shared clients forgotten."""
    from gpucloud.providers.aws import reset_shared

    install()
    HOOKS.reset()
    reset_shared(channels_only=True)
    yield HOOKS
    HOOKS.reset()


@pytest.fixture
def provider(moto: Moto, hooks: AwsHooks) -> Any:
    """An AwsProvider that retries and polls at once and sees a fixed public IP."""
    from gpucloud.providers.aws import AwsProvider

    p = AwsProvider(retry_base_s=0.01, poll_s=0.05, sleep=lambda s: None, public_ip=lambda: "203.0.113.7")
    p.TERMINATE_TIMEOUT_S = p.SG_DELETE_TIMEOUT_S = 5.0
    return p


@pytest.fixture
def journal(gpucloud_home: Any) -> Any:
    """A journal over the test's own state store."""
    from gpucloud.state.runs_db import Journal, Store

    return Journal(Store())
