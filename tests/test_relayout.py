"""tools/relayout.py on a small checkout of its own: modules move into their packages, every form of
reference follows them (absolute, `from gpucloud import x`, a package's names split into a module,
`mock.patch` strings, `-m` module paths, docs paths, paths a test computes from its own file, fixtures
shared through a folder's conftest.py), files no table names are listed, and a second run changes
nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("relayout", REPO / "tools" / "relayout.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["relayout"] = module
    spec.loader.exec_module(module)
    return module


FILES = {
    "gpucloud/__init__.py": '"""pkg."""\n',
    "gpucloud/errors.py": "class UserError(Exception): ...\n",
    "gpucloud/state.py": "class Store: ...\n",
    "gpucloud/spec_models.py": "class JobSpec: ...\n",
    "gpucloud/providers/__init__.py": "def names() -> list[str]:\n    return ['local']\n",
    "gpucloud/providers/ssh_transport.py": "def run() -> None: ...\n",
    "gpucloud/ci_output.py": "def main() -> None: ...\n",
    "gpucloud/mystery.py": (
        "from gpucloud import errors, providers, state\n"
        "from gpucloud.providers import names, ssh_transport\n"
        "from gpucloud.spec_models import JobSpec\n"
        "import gpucloud.state\n\n"
        "X = (errors, providers.names(), state.Store, names, ssh_transport, JobSpec, gpucloud.state.Store)\n"
    ),
    "tests/__init__.py": "",
    "tests/test_aws_e2e.py": (
        "from pathlib import Path\n\nimport pytest\n\nREPO = Path(__file__).resolve().parent.parent\n\n\n"
        "@pytest.fixture\ndef aws_env() -> int:\n    return 1\n"
    ),
    "tests/test_aws_policy.py": (
        "from unittest import mock\n\nfrom tests.test_aws_e2e import aws_env  # noqa: F401\n\n\n"
        "def test_policy(aws_env: int) -> None:\n"
        '    with mock.patch("gpucloud.state.Store"):\n'
        "        assert aws_env == 1\n"
    ),
    "tests/test_brand_new.py": "def test_new() -> None: ...\n",
    "docs/NOTES.md": (
        "See `gpucloud/state.py`, `spec_models` and `python -m gpucloud.ci_output`; tests/test_aws_e2e.py.\n"
    ),
}


def _checkout(root: Path) -> None:
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "pyproject.toml").write_text("[tool.ruff]\nline-length = 120\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "old layout"], cwd=root, check=True)


def _run(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "relayout.py"), "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_relayout_moves_rewrites_lists_and_is_idempotent(tmp_path: Path) -> None:
    _checkout(tmp_path)
    first = _run(tmp_path)
    assert first.returncode == 1, first.stderr  # two files are in no table
    assert "NOT IN ANY TABLE (add it to MODULES/KEEP_MODULES or TESTS): gpucloud/mystery.py" in first.stdout
    assert "tests/test_brand_new.py" in first.stdout

    assert (tmp_path / "gpucloud/state/store.py").is_file() and not (tmp_path / "gpucloud/state.py").exists()
    assert (tmp_path / "gpucloud/providers/registry.py").read_text().startswith("def names()")
    assert (tmp_path / "gpucloud/providers/ssh/transport.py").is_file()
    assert (tmp_path / "gpucloud/state/__init__.py").read_text().startswith('"""')
    mystery = (tmp_path / "gpucloud/mystery.py").read_text()
    for line in (
        "from gpucloud import errors",
        "from gpucloud.providers import registry as providers",
        "from gpucloud.state import store as state",
        "from gpucloud.providers.registry import names",
        "from gpucloud.providers.ssh import transport as ssh_transport",
        "from gpucloud.spec.models import JobSpec",
        "import gpucloud.state.store",
    ):
        assert line in mystery, mystery
    assert "gpucloud.state.store.Store)" in mystery

    policy = (tmp_path / "tests/providers/aws/test_aws_policy.py").read_text()
    assert 'mock.patch("gpucloud.state.store.Store")' in policy
    assert "import aws_env" not in policy  # the shared fixture comes from the folder's conftest.py
    conftest = (tmp_path / "tests/providers/aws/conftest.py").read_text()
    assert "from tests.providers.aws.test_aws_e2e import aws_env  # noqa: F401" in conftest
    assert (tmp_path / "tests/providers/__init__.py").is_file()
    assert "Path(__file__).resolve().parents[3]" in (tmp_path / "tests/providers/aws/test_aws_e2e.py").read_text()
    notes = (tmp_path / "docs/NOTES.md").read_text()
    assert "`gpucloud/state/store.py`, `spec/models` and `python -m gpucloud.ui.ci`" in notes
    assert "tests/providers/aws/test_aws_e2e.py" in notes

    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path, capture_output=True, text=True).stdout
    second = _run(tmp_path)
    assert "0 files moved, 0 files rewritten" in second.stdout
    again = subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert again == status
    assert (tmp_path / "gpucloud/mystery.py").read_text() == mystery


def test_module_names_map_by_longest_old_prefix(tmp_path: Path) -> None:
    _checkout(tmp_path)
    tool = _tool()
    rw = tool.Rewriter(tool.scan(tmp_path))
    assert rw.module("gpucloud.state.Store.open") == "gpucloud.state.store.Store.open"
    assert rw.module("gpucloud.providers.names") == "gpucloud.providers.registry.names"
    assert rw.module("gpucloud.providers") == "gpucloud.providers"  # the package itself stays
    assert rw.module("gpucloud.providers.ssh_transport.run") == "gpucloud.providers.ssh.transport.run"
    assert rw.module("gpucloud.statefoo") == "gpucloud.statefoo"
    assert rw.module("gpucloud.errors.UserError") == "gpucloud.errors.UserError"
