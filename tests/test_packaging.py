"""What a user installs works: the wheel (and the sdist) built from this tree, installed into a
fresh venv without `-e`, imports every module and runs the commands that need the cloud providers'
modules and the packaged data (catalog CSVs, the shim template), none exiting 70.

No network: the build runs without isolation (the build backend comes from this environment) and
the fresh venv takes its dependencies from this interpreter's site-packages through a .pth file
that is read after the venv's own site-packages, so gpucloud itself comes only from the wheel.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.source_tree import SOURCE, TESTS_ROOT, built_dist

pytestmark = pytest.mark.slow

EXAMPLE = TESTS_ROOT / "examples" / "t4-any-cloud.yaml"
# A module whose import runs the CLI (python -m gpucloud), not a library module.
NOT_IMPORTED = {"gpucloud.__main__"}
WALK = """
import importlib, json, pkgutil, sys
import gpucloud
names = sorted(m.name for m in pkgutil.walk_packages(gpucloud.__path__, "gpucloud."))
files = {}
for name in names:
    if name in set(sys.argv[1:]):
        continue
    files[name] = importlib.import_module(name).__file__
print(json.dumps({"package": gpucloud.__file__, "modules": names, "files": files}))
"""


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_dist(tmp_path_factory.mktemp("dist"))


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {folder}, found {found}"
    return found[0]


def _host_site_dirs() -> list[str]:
    """This interpreter's site-packages folders (the dependencies), never a source checkout."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir() and not (Path(d) / "pyproject.toml").exists()]


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed the way a user's `pip install` does (no -e)."""
    root = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(root / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            str(_one(dist, "gpucloud-*.whl")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Only now: with this interpreter's site-packages visible, pip would find the gpucloud installed
    # there (CI's) and install nothing.
    own_site = _one(root / "lib", "python3*/site-packages")
    (own_site / "zz_host_dependencies.pth").write_text("\n".join(_host_site_dirs()) + "\n")
    return root


def _env(tmp_path: Path) -> dict[str, str]:
    """No credentials for any cloud, no path back to this checkout."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_", "PYTHON", "IDENTITY_", "MSI_"))
    }
    env.update(
        {
            "GPUCLOUD_HOME": str(tmp_path / "home"),
            "HOME": str(tmp_path),
            "CI": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
            "NO_COLOR": "1",
        }
    )
    return env


def _gpucloud(venv: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(venv / "bin" / "gpucloud"), *args],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=180,
    )
    assert proc.returncode != 70, f"gpucloud {' '.join(args)} exited 70:\n{proc.stderr[-3000:]}"
    assert "ModuleNotFoundError" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_the_wheel_ships_every_module_and_data_file(dist: Path) -> None:
    names = set(zipfile.ZipFile(_one(dist, "gpucloud-*.whl")).namelist())
    assert {
        "gpucloud/templates/shim.sh.j2",
        "gpucloud/vm/protocol.py",
        "gpucloud/vm/agent/__main__.py",
        "gpucloud/catalog/data/offerings.csv",
        "gpucloud/providers/aws/__init__.py",
        "gpucloud/providers/azure/__init__.py",
    } <= names
    if (SOURCE / "gpucloud").is_dir():
        source = {
            p.relative_to(SOURCE).as_posix()
            for p in (SOURCE / "gpucloud").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        }
        source |= {f"gpucloud/templates/{p.name}" for p in (SOURCE / "templates").iterdir() if p.is_file()}
        assert source - names == set(), "files the wheel leaves out"


def test_the_sdist_has_the_templates_and_catalog_data(dist: Path) -> None:
    with tarfile.open(_one(dist, "gpucloud-*.tar.gz")) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {
        "pyproject.toml",
        "templates/shim.sh.j2",
        "gpucloud/catalog/data/offerings.csv",
        "gpucloud/catalog/data/gpus.csv",
        "gpucloud/providers/aws/__init__.py",
        "gpucloud/providers/azure/__init__.py",
    } <= names
    if (SOURCE / "gpucloud").is_dir():
        data = {p.relative_to(SOURCE).as_posix() for p in (SOURCE / "gpucloud" / "catalog" / "data").iterdir()}
        assert data <= names


def test_every_module_imports_from_the_installed_package(venv: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", WALK, *NOT_IMPORTED],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    walked = json.loads(proc.stdout)
    installed = Path(walked["package"]).parent
    assert installed.is_relative_to(venv), f"gpucloud came from {installed}, not the fresh venv"
    assert all(Path(f).is_relative_to(installed) for f in walked["files"].values())
    assert {"gpucloud.providers.aws.provider", "gpucloud.providers.azure.provider", "gpucloud.cli.app"} <= set(
        walked["modules"]
    )
    if (SOURCE / "gpucloud").is_dir():
        source = set()
        for path in (SOURCE / "gpucloud").rglob("*.py"):
            parts = list(path.relative_to(SOURCE).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if len(parts) > 1:
                source.add(".".join(parts))
        assert source - set(walked["modules"]) == set(), "modules of the source tree the installed package lacks"


def test_check_json_without_credentials_is_a_document(venv: Path, tmp_path: Path) -> None:
    proc = _gpucloud(venv, tmp_path, "check", "--json")
    assert proc.returncode in (0, 78), proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    clouds = {c["cloud"]: c for c in doc["clouds"]}
    assert {"aws", "azure"} <= set(clouds)
    assert clouds["aws"]["credentials"] is False and clouds["aws"]["problems"]


@pytest.mark.parametrize("cloud", ["aws", "azure"])
def test_render_from_the_installed_package(venv: Path, tmp_path: Path, cloud: str) -> None:
    proc = _gpucloud(venv, tmp_path, "render", str(EXAMPLE), "--cloud", cloud)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("#!/bin/sh") and "# gpucloud shim" in proc.stdout
    cfg = _gpucloud(venv, tmp_path, "render", str(EXAMPLE), "--cloud", cloud, "--agent-config")
    assert cfg.returncode == 0 and json.loads(cfg.stdout)["run_id"] == "RUN_ID", cfg.stderr[-3000:]


def test_iam_policy_from_the_installed_package(venv: Path, tmp_path: Path) -> None:
    proc = _gpucloud(venv, tmp_path, "iam-policy", "aws")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["Statement"]


def _guarded_tree(root: Path, *, with_checkout: bool) -> Path:
    """A folder with this suite's conftest and one test; with a `gpucloud/` package in it when
    `with_checkout` (what `python -m pytest` from a source checkout would import)."""
    support = ("__init__.py", "source_tree.py", "cpu_profile.py", "xdist_files.py")  # what conftest.py imports
    for name in ("tests/__init__.py", "tests/conftest.py", *(f"tests/support/{s}" for s in support)):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text((TESTS_ROOT / name).read_text())
    (root / "tests" / "test_one.py").write_text("def test_one() -> None:\n    import gpucloud\n")
    if with_checkout:
        (root / "gpucloud").mkdir()
        (root / "gpucloud" / "__init__.py").write_text('__version__ = "0.0.0"\n')
    return root


@pytest.mark.parametrize("with_checkout", [True, False])
def test_the_installed_mode_guard(venv: Path, tmp_path: Path, with_checkout: bool) -> None:
    """GPUCLOUD_TEST_INSTALLED=1 stops the run (exit 3, before any test) when gpucloud would come
    from a checkout; from a folder without one, against the installed wheel, the tests run."""
    tree = _guarded_tree(tmp_path / "tree", with_checkout=with_checkout)
    env = {**_env(tmp_path), "GPUCLOUD_TEST_INSTALLED": "1", "GPUCLOUD_SOURCE_TREE": str(SOURCE)}
    proc = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "tests/test_one.py",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        timeout=300,
    )
    if with_checkout:
        assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert f"this process imports gpucloud from {tree / 'gpucloud' / '__init__.py'}" in proc.stdout + proc.stderr
        assert "a CLI subprocess imports gpucloud from" in proc.stdout + proc.stderr
    else:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "1 passed" in proc.stdout
