"""`python -m tests.support.aws_cli ARGS...`: the real gpucloud CLI, with the AWS test hooks.

The product code does not know it is under test: this launcher installs the botocore event hooks
(fault injection from GPUCLOUD_TEST_AWS_FAULTS, the operation recorder from
GPUCLOUD_TEST_AWS_RECORD, ClientToken idempotency) and shortens the provider's waits (moto answers
at once), then calls `gpucloud.cli.app.main` exactly as the `gpucloud` entry point does.
"""

from __future__ import annotations


def make_fast() -> None:
    """Polling and backoff suited to a fake cloud that answers in milliseconds."""
    import dataclasses

    from gpucloud.providers.aws import AwsProvider
    from gpucloud.providers.aws.channel import S3Channel

    AwsProvider.capabilities = dataclasses.replace(AwsProvider.capabilities, poll_interval=0.2)
    AwsProvider.RETRY_ATTEMPTS = 3
    AwsProvider.RETRY_BASE_S = 0.01
    AwsProvider.RETRY_CAP_S = 0.05
    AwsProvider.POLL_S = 0.1
    AwsProvider.TERMINATE_TIMEOUT_S = 20.0
    AwsProvider.SG_DELETE_TIMEOUT_S = 10.0
    S3Channel.RETRY_ATTEMPTS = 3
    S3Channel.RETRY_BASE_S = 0.01
    S3Channel.RETRY_CAP_S = 0.05
    # moto answers a quota at once, but building the first Service Quotas clients takes seconds on a
    # loaded 2-core machine: the tests look at the verdicts, so the budget may not cut them off.
    from gpucloud.run import quota_gate

    quota_gate.BUDGET_S = 60.0


def main() -> None:
    from tests.support.aws_faults import install, load_env

    load_env(install())
    make_fast()
    from gpucloud.cli.app import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
