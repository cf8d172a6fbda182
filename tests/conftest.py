"""Shared test settings: every test gets its own GPUCLOUD_HOME and runs as CI would (no prompts)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path_factory.mktemp("gpucloud-home")
    monkeypatch.setenv("GPUCLOUD_HOME", str(home))
    monkeypatch.setenv("CI", "true")
    return home


@pytest.fixture
def gpucloud_home(_isolated_home: Path) -> Path:
    return _isolated_home
