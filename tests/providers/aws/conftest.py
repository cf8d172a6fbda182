"""Fixtures the tests of this folder share: defined once in a sibling test module, found here by pytest."""

from tests.providers.aws.test_aws_e2e import aws_env, inproc  # noqa: F401
from tests.providers.aws.test_aws_provider import hooks, journal, provider  # noqa: F401
