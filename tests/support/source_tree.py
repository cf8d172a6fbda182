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


def package_dir() -> Path:
    """The folder of the gpucloud package under test (site-packages in CI, the checkout otherwise)."""
    import gpucloud

    return Path(gpucloud.__file__).resolve().parent
