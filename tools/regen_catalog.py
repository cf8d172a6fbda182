"""Regenerate the shipped offerings.csv from the clouds' APIs with the same code as
`gpucloud catalog refresh` (docs/CATALOG.md).

It refreshes into a throw-away GPUCLOUD_HOME (the user's own cache is not touched), keeps the
shipped rows the refresh does not replace (other regions, retired types the APIs no longer list),
validates the result with the catalog's own loader and only then replaces the file.

Usage: python tools/regen_catalog.py [--cloud C ...] [--region R ...] [--out PATH]
Default regions: those the shipped file already covers (the shipped file stays small; the full
every-region catalog lives in the cache that `catalog refresh` writes).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

DATA = Path(__file__).resolve().parent.parent / "gpucloud" / "catalog" / "data" / "offerings.csv"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cloud", action="append", help="only this cloud (repeatable)")
    parser.add_argument("--region", action="append", help="only this region (repeatable)")
    parser.add_argument("--out", type=Path, default=DATA, help="file to write (default: the shipped offerings.csv)")
    args = parser.parse_args(argv)

    os.environ["GPUCLOUD_HOME"] = tempfile.mkdtemp(prefix="gpucloud-regen-")
    from gpucloud.catalog import load_catalog, offerings_db, shipped_catalog, validate_offerings_text
    from gpucloud.catalog.refresh import refresh
    from gpucloud.errors import GpucloudError

    load_catalog.cache_clear()  # type: ignore[attr-defined]
    shipped = shipped_catalog().offerings
    regions = args.region or sorted({o.region for o in shipped})
    try:
        report = refresh(clouds=args.cloud, regions=regions, progress=lambda m: print(m, file=sys.stderr))
    except GpucloudError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    wanted = set(regions)
    rows = [o for o in load_catalog().offerings if o.region in wanted]
    rows.sort(key=lambda o: (o.cloud, o.gpu, o.instance_type, o.region))
    text = offerings_db.offerings_csv(rows)
    validate_offerings_text(text)
    offerings_db.replace_file(args.out, text)
    for cloud, info in report.clouds.items():
        for problem in info.get("problems", []) or []:  # type: ignore[union-attr]
            print(f"{cloud}: missing: {problem}", file=sys.stderr)
    print(f"wrote {len(rows)} offerings to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
