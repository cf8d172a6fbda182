"""Fixtures the tests of this folder share, from tests/support/, found here by pytest."""

from tests.support.aws_inproc import hooks, journal, provider  # noqa: F401
from tests.support.aws_runs import aws_env, inproc  # noqa: F401
