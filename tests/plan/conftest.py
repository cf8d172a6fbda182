"""Fixtures of the plan tests: the real container engine and registries (tests/support/containers.py)."""

from tests.support.containers import container_lab  # noqa: F401 - a fixture, used by name
