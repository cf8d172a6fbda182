"""The CLI turns pydantic's plugin scan off for its own process (start-up time) but a child that runs
the user's own work gets the environment as the user set it; a user's own setting is kept."""

from __future__ import annotations

import os

import pytest

from gpucloud import child_env


def test_the_cli_setting_is_not_passed_on_and_a_users_own_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(child_env.PLUGINS_ENV, raising=False)
    monkeypatch.delenv(child_env.PLUGINS_SET_HERE, raising=False)
    child_env.skip_pydantic_plugins()
    assert os.environ[child_env.PLUGINS_ENV] == "__all__"
    env = child_env.user_env()
    assert child_env.PLUGINS_ENV not in env and child_env.PLUGINS_SET_HERE not in env
    monkeypatch.setenv(child_env.PLUGINS_ENV, "logfire")
    monkeypatch.delenv(child_env.PLUGINS_SET_HERE)
    child_env.skip_pydantic_plugins()
    assert os.environ[child_env.PLUGINS_ENV] == "logfire" and child_env.user_env()[child_env.PLUGINS_ENV] == "logfire"
