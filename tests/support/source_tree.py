"""Where the tests find gpucloud's source files, and whether they test an installed package.

CI runs the suite against the installed wheel from a folder that holds the tests but no
`gpucloud/` (so nothing can import the checkout by accident); it points GPUCLOUD_SOURCE_TREE at
the checkout for the few tests that read source files or build the package themselves.
"""

from __future__ import annotations

import os
from pathlib import Path

TESTS_ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(os.environ.get("GPUCLOUD_SOURCE_TREE") or TESTS_ROOT)
TEST_INSTALLED = os.environ.get("GPUCLOUD_TEST_INSTALLED") == "1"


def built_dist(out: Path) -> Path:
    """The folder with gpucloud's wheel and sdist: the ones CI built and installed
    (GPUCLOUD_TEST_DIST), else built into `out` from the source tree, offline (no build isolation:
    the backend comes from this environment) and the wheel from the sdist, as pip would."""
    import subprocess
    import sys

    given = os.environ.get("GPUCLOUD_TEST_DIST")
    if given:
        return Path(given)
    if not (SOURCE / "pyproject.toml").is_file() or not (SOURCE / "gpucloud").is_dir():
        raise AssertionError(f"no source tree at {SOURCE} to build; set GPUCLOUD_SOURCE_TREE or GPUCLOUD_TEST_DIST")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(SOURCE)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def package_dir() -> Path:
    """The folder of the gpucloud package under test (site-packages in CI, the checkout otherwise)."""
    import gpucloud

    return Path(gpucloud.__file__).resolve().parent
