"""Settings the CLI makes for its own process only, and the environment a child that runs the user's
own work gets without them (sbatch on this machine exports its environment to the job)."""

from __future__ import annotations

import os

PLUGINS_ENV = "PYDANTIC_DISABLE_PLUGINS"
PLUGINS_SET_HERE = "GPUCLOUD_PYDANTIC_PLUGINS_OFF"  # marks the setting as the CLI's, not the user's


def skip_pydantic_plugins() -> None:
    """pydantic looks for plugins in every installed distribution's entry points the first time a
    model is built (several ms in a large venv); gpucloud's models use none. A user's own setting wins."""
    if PLUGINS_ENV not in os.environ:
        os.environ[PLUGINS_ENV] = os.environ[PLUGINS_SET_HERE] = "__all__"


def user_env() -> dict[str, str]:
    """This process's environment as the user set it."""
    env = dict(os.environ)
    if env.pop(PLUGINS_SET_HERE, None) is not None:
        env.pop(PLUGINS_ENV, None)
    return env
