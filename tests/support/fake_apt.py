"""A fake `apt-get install` that resolves against tests/data/nvidia_repo_packages.txt.

The simulators' apt-get stub hands its arguments here when STUB_APT_REPO names a Packages file.
It does what the stack stage relies on apt doing: picks each package's candidate by the apt
preferences in force (files under $GPUCLOUD_ETC/apt/preferences.d, and the pins of an installed
NVIDIA version-locking package), honours `name=version-glob` requests, follows `Depends:` with
their version relations using only the candidate (as apt does), and fails like dpkg does when a
DKMS kernel module is installed without the headers of the running kernel. Packages the file
does not know (python3-pip, CUDA toolkits, cuDNN) install as given, as the plain stub did.
Installed state: $STUB_STATE/pkgs/<name> holds the version; $STUB_STATE/kmod the built module's
driver version, which the stub nvidia-smi reports.
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PRIORITY = 500


@dataclass
class Pkg:
    name: str
    version: str
    depends: str = ""
    dkms: bool = False
    pins: list[tuple[list[str], str, int]] = field(default_factory=list)


def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isalpha():
        return ord(c)
    return ord(c) + 256 if c else 0


def _cmp_part(a: str, b: str) -> int:
    """dpkg's comparison of an upstream version or a revision."""
    while a or b:
        na = re.match(r"\D*", a).group()  # type: ignore[union-attr]
        nb = re.match(r"\D*", b).group()  # type: ignore[union-attr]
        for i in range(max(len(na), len(nb))):
            x, y = _order(na[i] if i < len(na) else ""), _order(nb[i] if i < len(nb) else "")
            if x != y:
                return -1 if x < y else 1
        a, b = a[len(na) :], b[len(nb) :]
        da = re.match(r"\d*", a).group()  # type: ignore[union-attr]
        db = re.match(r"\d*", b).group()  # type: ignore[union-attr]
        if int(da or 0) != int(db or 0):
            return -1 if int(da or 0) < int(db or 0) else 1
        a, b = a[len(da) :], b[len(db) :]
    return 0


def vcmp(a: str, b: str) -> int:
    """Compare two Debian versions (no epochs in this repository)."""
    ua, _, ra = a.rpartition("-") if "-" in a else (a, "", "")
    ub, _, rb = b.rpartition("-") if "-" in b else (b, "", "")
    return _cmp_part(ua, ub) or _cmp_part(ra, rb)


def satisfies(version: str, op: str, want: str) -> bool:
    c = vcmp(version, want)
    return {">=": c >= 0, "<=": c <= 0, ">>": c > 0, "<<": c < 0, "=": c == 0}[op]


def load_repo(path: Path) -> dict[str, list[Pkg]]:
    repo: dict[str, list[Pkg]] = {}
    for block in path.read_text().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith("#"))
        if "Package" not in fields:
            continue
        pkg = Pkg(fields["Package"], fields["Version"], fields.get("Depends", ""), fields.get("X-Dkms") == "yes")
        if "X-Pins" in fields:
            globs, _, ver = fields["X-Pins"].partition(" = ")
            pkg.pins.append((globs.split(), ver.strip(), 1001))
        repo.setdefault(pkg.name, []).append(pkg)
    return repo


def load_prefs(etc: Path) -> list[tuple[list[str], str, int]]:
    """Pins of apt preferences files: `Package: globs`, `Pin: version GLOB`, `Pin-Priority: N`."""
    pins = []
    folder = etc / "apt" / "preferences.d"
    for f in sorted(folder.iterdir()) if folder.is_dir() else []:
        for block in f.read_text().split("\n\n"):
            fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
            pin = fields.get("Pin", "").strip()
            if "Package" in fields and pin.startswith("version "):
                pins.append(
                    (fields["Package"].split(), pin[len("version ") :].strip(), int(fields.get("Pin-Priority", 500)))
                )
    return pins


class Apt:
    def __init__(self, repo: dict[str, list[Pkg]], state: Path, etc: Path, kernel: str) -> None:
        self.repo, self.state, self.kernel = repo, state, kernel
        self.pkgs = state / "pkgs"
        self.pkgs.mkdir(parents=True, exist_ok=True)
        self.pins = load_prefs(etc)
        for name in os.listdir(self.pkgs):
            for p in repo.get(name, []):
                if p.version == (self.pkgs / name).read_text():
                    self.pins += p.pins
        self.plan: dict[str, Pkg] = {}
        self.queue: list[tuple[str, str]] = []  # (owner, Depends clause) still to satisfy

    def installed(self, name: str) -> str | None:
        f = self.pkgs / name
        return f.read_text() if f.exists() else None

    def priority(self, p: Pkg) -> int:
        return max(
            [
                prio
                for globs, ver, prio in self.pins
                if any(fnmatch.fnmatch(p.name, g) for g in globs) and fnmatch.fnmatch(p.version, ver)
            ]
            or [DEFAULT_PRIORITY]
        )

    def candidate(self, name: str) -> Pkg | None:
        versions = self.repo.get(name, [])
        best = None
        for p in versions:
            if (
                best is None
                or (self.priority(p), 0) > (self.priority(best), 0)
                or (self.priority(p) == self.priority(best) and vcmp(p.version, best.version) > 0)
            ):
                best = p
        return best

    def want(self, pkg: Pkg) -> None:
        if pkg.name in self.plan:
            if self.plan[pkg.name].version != pkg.version:
                raise SystemExit(f"E: conflicting versions of {pkg.name}")
            return
        self.plan[pkg.name] = pkg
        self.queue += [(pkg.name, c) for c in filter(None, (c.strip() for c in pkg.depends.split(",")))]

    def resolve(self) -> None:
        """Plain dependencies first, alternatives ("a | b") last: an alternative already marked
        for install (e.g. the open kernel module the request itself names) satisfies the group."""
        while self.queue:
            i = next((n for n, (_, c) in enumerate(self.queue) if "|" not in c), 0)
            owner, clause = self.queue.pop(i)
            self.depend(owner, clause)

    def depend(self, owner: str, clause: str) -> None:
        tried = []
        alts = []
        for alt in clause.split("|"):
            m = re.fullmatch(r"\s*([\w.+-]+)\s*(?:\((<<|<=|=|>=|>>)\s*([^)]+)\))?\s*", alt)
            assert m, alt
            alts.append((m.group(1), m.group(2), (m.group(3) or "").strip()))
        for name, op, ver in alts:
            planned = self.plan.get(name)
            if planned is not None and (not op or satisfies(planned.version, op, ver)):
                return
            have = self.installed(name)
            if planned is None and have is not None and (not op or satisfies(have, op, ver)):
                return
        for name, op, ver in alts:
            planned = self.plan.get(name)
            cand = self.candidate(name)
            if cand is not None and planned is None and (not op or satisfies(cand.version, op, ver)):
                self.want(cand)
                return
            tried.append(
                f"{name} {('(' + op + ' ' + ver + ')') if op else ''} but "
                f"{cand.version if cand else 'nothing'} is to be installed"
            )
        raise SystemExit(
            f"The following packages have unmet dependencies:\n {owner} : Depends: {tried[0]}\n"
            "E: Unable to correct problems, you have held broken packages."
        )

    def request(self, arg: str) -> None:
        name, _, glob = arg.partition("=")
        if name.startswith("linux-headers-"):
            self.plan[name] = Pkg(name, name[len("linux-headers-") :])
            return
        if name not in self.repo:
            self.plan[name] = Pkg(name, glob.replace("*", "0") if glob else "1.0-stub")
            return
        if glob:
            fits = [p for p in self.repo[name] if fnmatch.fnmatch(p.version, glob)]
            if not fits:
                raise SystemExit(f"E: Version '{glob}' for '{name}' was not found")
            pick = fits[0]
            for p in fits:
                pick = p if vcmp(p.version, pick.version) > 0 else pick
        else:
            pick = self.candidate(name)  # type: ignore[assignment]
        self.want(pick)

    def commit(self) -> None:
        headers = f"linux-headers-{self.kernel}"
        for pkg in self.plan.values():
            if pkg.dkms and self.installed(headers) is None:
                raise SystemExit(
                    f"Error! Your kernel headers for kernel {self.kernel} cannot be found.\n"
                    f"dpkg: error processing package {pkg.name} (--configure)\n"
                    "E: Sub-process /usr/bin/dpkg returned an error code (1)"
                )
        for pkg in self.plan.values():
            (self.pkgs / pkg.name).write_text(pkg.version)
            if pkg.dkms:
                (self.state / "kmod").write_text(pkg.version.rpartition("-")[0])


def main(argv: list[str]) -> int:
    if "install" not in argv:
        return 0
    names = [a for a in argv[argv.index("install") + 1 :] if not a.startswith("-")]
    state = Path(os.environ["STUB_STATE"])
    apt = Apt(
        load_repo(Path(os.environ["STUB_APT_REPO"])),
        state,
        Path(os.environ.get("GPUCLOUD_ETC", "/etc")),
        os.environ.get("STUB_KERNEL") or os.uname().release,
    )
    try:
        for name in names:
            apt.request(name)
        apt.resolve()
        apt.commit()
    except SystemExit as exc:
        print(exc.code, file=sys.stderr)
        return 100
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
