"""Move gpucloud's flat modules into packages along the data's way, and the tests into folders that
mirror them, rewriting every reference on the way. Run at the root of a checkout:

    python3 tools/relayout.py            # do it (git mv + rewrites), then ruff fixes import order
    python3 tools/relayout.py --dry-run  # print what would move and what no table names

Deterministic and idempotent: a table entry acts only while its old file exists, so a second run
finds nothing to move and changes nothing. Files that no table names (modules or tests added on
other branches) are printed, never guessed at: add them to MODULES or TESTS and run again.

Why a script and not a commit: many branches change these modules at once; the moves are made once,
on the merged tree, by running this.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Old module path (relative to the repository root) -> new path. A package's __init__.py whose
# code moves to a module of its own is listed too; its folder gets a bare __init__.py.
MODULES: dict[str, str] = {
    # spec/: the job file
    "gpucloud/spec.py": "gpucloud/spec/load.py",
    "gpucloud/spec_errors.py": "gpucloud/spec/errors.py",
    "gpucloud/spec_models.py": "gpucloud/spec/models.py",
    "gpucloud/spec_recovery.py": "gpucloud/spec/recovery.py",
    "gpucloud/spec_values.py": "gpucloud/spec/values.py",
    "gpucloud/spec_yaml.py": "gpucloud/spec/source.py",
    "gpucloud/spec_gpu.py": "gpucloud/spec/gpu.py",
    "gpucloud/spec_data.py": "gpucloud/spec/data.py",
    "gpucloud/spec_secrets.py": "gpucloud/spec/secrets.py",
    # plan/: stacks, images, candidates
    "gpucloud/planner.py": "gpucloud/plan/planner.py",
    "gpucloud/plan_rows.py": "gpucloud/plan/rows.py",
    "gpucloud/plan_match.py": "gpucloud/plan/match.py",
    "gpucloud/provider_requests.py": "gpucloud/plan/requests.py",
    "gpucloud/stacks.py": "gpucloud/plan/stacks.py",
    "gpucloud/stack_data.py": "gpucloud/plan/stack_data.py",
    "gpucloud/images.py": "gpucloud/plan/images.py",
    "gpucloud/images_build.py": "gpucloud/plan/baked.py",
    # providers/: the registry on its own, one package per provider
    "gpucloud/providers/__init__.py": "gpucloud/providers/registry.py",
    "gpucloud/providers/local.py": "gpucloud/providers/local/provider.py",
    "gpucloud/vm_engine.py": "gpucloud/providers/local/engine.py",
    "gpucloud/providers/ssh.py": "gpucloud/providers/ssh/provider.py",
    "gpucloud/providers/ssh_channel.py": "gpucloud/providers/ssh/channel.py",
    "gpucloud/providers/ssh_probe.py": "gpucloud/providers/ssh/probe.py",
    "gpucloud/providers/ssh_transport.py": "gpucloud/providers/ssh/transport.py",
    # channel/: the run's object store and what is taken from it
    "gpucloud/channel.py": "gpucloud/channel/store.py",
    "gpucloud/channel_trust.py": "gpucloud/channel/trust.py",
    "gpucloud/extract.py": "gpucloud/channel/extract.py",
    # vm/: what the VM is given
    "gpucloud/render.py": "gpucloud/vm/render.py",
    "gpucloud/vm_env.py": "gpucloud/vm/env.py",
    # run/: one run from launch to teardown, and the commands around runs
    "gpucloud/lifecycle.py": "gpucloud/run/lifecycle.py",
    "gpucloud/run_plan.py": "gpucloud/run/plan.py",
    "gpucloud/run_artifacts.py": "gpucloud/run/artifacts.py",
    "gpucloud/failover.py": "gpucloud/run/failover.py",
    "gpucloud/watch.py": "gpucloud/run/watch.py",
    "gpucloud/teardown.py": "gpucloud/run/teardown.py",
    "gpucloud/recovery.py": "gpucloud/run/recovery.py",
    "gpucloud/collect.py": "gpucloud/run/collect.py",
    "gpucloud/commands.py": "gpucloud/run/commands.py",
    "gpucloud/cost.py": "gpucloud/run/cost.py",
    "gpucloud/runlog.py": "gpucloud/run/log.py",
    "gpucloud/check.py": "gpucloud/run/check.py",
    "gpucloud/bake.py": "gpucloud/run/bake.py",
    "gpucloud/secret_delivery.py": "gpucloud/run/secrets.py",
    "gpucloud/data_grants.py": "gpucloud/run/data_grants.py",
    "gpucloud/gpu_report.py": "gpucloud/run/gpu_report.py",
    "gpucloud/plot.py": "gpucloud/run/plot.py",
    # state/: the state store
    "gpucloud/state.py": "gpucloud/state/store.py",
    "gpucloud/state_guard.py": "gpucloud/state/guard.py",
    "gpucloud/state_schema.py": "gpucloud/state/schema.py",
    "gpucloud/state_records.py": "gpucloud/state/records.py",
    # ui/: what the user reads
    "gpucloud/views.py": "gpucloud/ui/views.py",
    "gpucloud/progress.py": "gpucloud/ui/progress.py",
    "gpucloud/jsonout.py": "gpucloud/ui/jsonout.py",
    "gpucloud/ci_output.py": "gpucloud/ui/ci.py",
    "gpucloud/timeline.py": "gpucloud/ui/timeline.py",
    "gpucloud/prose.py": "gpucloud/ui/prose.py",
    "gpucloud/upload_info.py": "gpucloud/ui/upload.py",
    # cli/: the command line
    "gpucloud/cli.py": "gpucloud/cli/app.py",
    "gpucloud/cli_images.py": "gpucloud/cli/images.py",
    "gpucloud/cli_setup.py": "gpucloud/cli/setup.py",
    "gpucloud/cli_options.py": "gpucloud/cli/options.py",
    "gpucloud/entry.py": "gpucloud/cli/entry.py",
}

# Modules that stay where they are (with everything below a folder ending in "/").
KEEP_MODULES: tuple[str, ...] = (
    "gpucloud/__init__.py",
    "gpucloud/__main__.py",
    "gpucloud/errors.py",
    "gpucloud/catalog/",
    "gpucloud/providers/base.py",
    "gpucloud/providers/contract.py",
    "gpucloud/providers/aws/",
    "gpucloud/providers/azure/",
    "gpucloud/providers/slurm/",
    "gpucloud/vm/",
)

# The new packages' __init__.py: a docstring only (a folder marker imports nothing, so passing
# through it is no dependency: tests/test_structure.py).
PACKAGES: dict[str, str] = {
    "gpucloud/spec": "The job file: loading it, its models and values, and its errors naming file, line and field.",
    "gpucloud/plan": "The plan: stacks, images and baked images, and the candidates a run may launch.",
    "gpucloud/providers": "The providers: the registry, the contract (base.py) and one package per provider.",
    "gpucloud/providers/local": "The local provider: this machine, and a VM as a local process group.",
    "gpucloud/providers/ssh": "The ssh provider: machines of the user's own, reached over OpenSSH.",
    "gpucloud/channel": "The run's object store: code, manifests, logs, status and artifacts, and whose word counts.",
    "gpucloud/run": "One run from launch to teardown, and the commands around runs.",
    "gpucloud/state": "The state store: runs, attempts, the resource journal, events and phases.",
    "gpucloud/ui": "What the user reads: plans, statuses, progress, JSON and CI output.",
    "gpucloud/cli": "The command line: typer commands that import the module doing the work lazily.",
}

# Test file -> its folder below tests/ (mirroring the code it tests); "" keeps it at tests/ (tests of
# the project as a whole: structure, packaging, CI, docs).
TESTS: dict[str, str] = {
    "test_spec.py": "spec",
    "test_planner.py": "plan",
    "test_plan_alternatives.py": "plan",
    "test_stacks.py": "plan",
    "test_images.py": "plan",
    "test_stack_images.py": "plan",
    "test_images_build.py": "plan",
    "test_catalog.py": "catalog",
    "test_catalog_bounds.py": "catalog",
    "test_catalog_gpu_names.py": "catalog",
    "test_catalog_index.py": "catalog",
    "test_catalog_refresh.py": "catalog",
    "test_catalog_status.py": "catalog",
    "test_prices.py": "catalog",
    "test_error_kinds.py": "providers",
    "test_aws_deadline.py": "providers/aws",
    "test_aws_e2e.py": "providers/aws",
    "test_aws_iam_enforced.py": "providers/aws",
    "test_aws_multinode.py": "providers/aws",
    "test_aws_policy.py": "providers/aws",
    "test_aws_provider.py": "providers/aws",
    "test_iam_lint.py": "providers/aws",
    "test_images_e2e.py": "providers/aws",
    "test_azure_e2e.py": "providers/azure",
    "test_azure_multinode.py": "providers/azure",
    "test_azure_provider.py": "providers/azure",
    "test_images_azure_e2e.py": "providers/azure",
    "test_local_e2e.py": "providers/local",
    "test_ssh_bounds.py": "providers/ssh",
    "test_ssh_e2e.py": "providers/ssh",
    "test_ssh_os.py": "providers/ssh",
    "test_ssh_unit.py": "providers/ssh",
    "test_slurm_e2e.py": "providers/slurm",
    "test_slurm_unit.py": "providers/slurm",
    "test_channel.py": "channel",
    "test_extract.py": "channel",
    "test_log_grants.py": "channel",
    "test_user_data_reader.py": "channel",
    "test_apt_resolve.py": "vm",
    "test_bootstrap.py": "vm",
    "test_render.py": "vm",
    "test_render_stacks.py": "vm",
    "test_reboot.py": "vm",
    "test_scheduled_events.py": "vm",
    "test_vm_faults.py": "vm",
    "test_lifecycle.py": "run",
    "test_multinode.py": "run",
    "test_bounds.py": "run",
    "test_runlog_cap.py": "run",
    "test_spot.py": "run",
    "test_spot_clouds.py": "run",
    "test_fail_right_clouds.py": "run",
    "test_launch_credentials.py": "run",
    "test_secrets.py": "run",
    "test_secrets_clouds.py": "run",
    "test_data_e2e.py": "run",
    "test_data_units.py": "run",
    "test_gpu_report.py": "run",
    "test_gpu_usage_e2e.py": "run",
    "test_plot.py": "run",
    "test_state.py": "state",
    "test_state_damage.py": "state",
    "test_private_home.py": "state",
    "test_ci_output.py": "ui",
    "test_output_fits.py": "ui",
    "test_wrapped_messages.py": "ui",
    "test_cli_behaviour.py": "cli",
    "test_cli_offline.py": "cli",
    "test_fail_right.py": "cli",
    "test_held_out_inputs.py": "cli",
    "test_docs_cli.py": "",
    "test_structure.py": "",
    "test_startup_budget.py": "",
    "test_packaging.py": "",
    "test_ci_action.py": "",
    "test_ci_examples.py": "",
    "test_ci_script.py": "",
    "test_bench_counts.py": "",
    "test_relayout.py": "",
}

# Where references are rewritten (files below these, by suffix) besides the moved files themselves.
SCAN_DIRS = ("gpucloud", "tests", "bench", "tools", "examples", "docs", ".ci", ".github")
SCAN_FILES = ("README.md", "BENCHMARKS.md", "pyproject.toml", "action.yml", "CONTRIBUTING.md")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".cfg", ".ini", ".txt", ".sh", ".j2", ""}
# This script and its companions name the old paths on purpose.
SELF = {"tools/relayout.py", "tools/relayout_internals_map.md", "tools/scrub_docstrings.py", "tests/test_relayout.py"}

LAYERS_BLOCK = """LAYERS: dict[str, int] = {
    # import-free ground: errors, pure data, the VM wire format
    "gpucloud.errors": FOUNDATION,
    "gpucloud.plan.stack_data": FOUNDATION,
    "gpucloud.channel.extract": FOUNDATION,
    "gpucloud.channel.trust": FOUNDATION,
    "gpucloud.ui.timeline": FOUNDATION,
    "gpucloud.ui.prose": FOUNDATION,
    "gpucloud.state.records": FOUNDATION,
    "gpucloud.vm.protocol": FOUNDATION,
    "gpucloud.vm.agent": FOUNDATION,
    "gpucloud.vm.env": FOUNDATION,
    # where things are kept: the state store, the run's object store
    "gpucloud.state": STORES,
    "gpucloud.channel": STORES,
    # what crosses between the core and a provider: the registry, the contract, the catalog's rows
    "gpucloud.providers": CONTRACT,
    "gpucloud.providers.registry": CONTRACT,
    "gpucloud.providers.base": CONTRACT,
    "gpucloud.providers.contract": CONTRACT,
    "gpucloud.catalog": CONTRACT,
    # the job file
    "gpucloud.spec": SPEC,
    # the plan: stacks, images, candidates
    "gpucloud.plan": PLAN,
    # the machines: provider implementations, the VM's user-data and the local VM engine
    "gpucloud.providers.aws": MACHINES,
    "gpucloud.providers.azure": MACHINES,
    "gpucloud.providers.local": MACHINES,
    "gpucloud.providers.ssh": MACHINES,
    "gpucloud.providers.slurm": MACHINES,
    "gpucloud.vm": MACHINES,
    # what the user reads: plans, statuses, progress, JSON and CI output (a run reports through them)
    "gpucloud.ui": UI,
    "gpucloud.catalog.views": UI,
    # one run from launch to teardown, and the commands around runs
    "gpucloud.run": RUN,
    # the command line
    "gpucloud.cli": CLI,
    "gpucloud.__main__": CLI,
}"""

MAP_START = "## Module map"
MAP_END = "## Adding a provider"
PROVIDER_FILES_MARK = "The files a new provider touches, by path:"


def dotted(path: str) -> str:
    """gpucloud/spec/load.py -> gpucloud.spec.load; a package's __init__.py names the package."""
    parts = list(Path(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass
class Layout:
    """The moves that still apply to this checkout, as paths and as module names."""

    root: Path
    paths: dict[str, str]  # old relpath -> new relpath (files that still sit at the old place)
    modules: dict[str, str]  # old dotted -> new dotted
    split: dict[str, str]  # package whose __init__ code moves -> the module that takes it
    old_modules: set[str]  # every module of the checkout as it is now (gpucloud and tests)
    unknown: list[str]  # modules and tests that no table names


def scan(root: Path) -> Layout:
    paths: dict[str, str] = {}
    for old, new in MODULES.items():
        if old.endswith("/__init__.py"):
            # Moved once already when the new module exists and the __init__ holds no code of its own.
            if (root / old).is_file() and not (root / new).exists():
                paths[old] = new
            elif (root / old).is_file() and _has_code(root / old):
                sys.exit(f"error: {new} exists and {old} still holds code; merge them by hand, then run again")
        elif (root / old).is_file():
            if (root / new).exists():
                sys.exit(f"error: both {old} and {new} exist; merge them by hand, then run again")
            paths[old] = new
    for name, folder in TESTS.items():
        old = f"tests/{name}"
        new = f"tests/{folder}/{name}" if folder else old
        if old != new and (root / old).is_file():
            if (root / new).exists():
                sys.exit(f"error: both {old} and {new} exist; merge them by hand, then run again")
            paths[old] = new
    old_modules = {
        dotted(str(p.relative_to(root))) for top in ("gpucloud", "tests") for p in (root / top).rglob("*.py")
    }
    modules = {dotted(o): dotted(n) for o, n in paths.items()}
    split = {dotted(o): dotted(n) for o, n in paths.items() if o.endswith("/__init__.py")}
    # A split package itself stays where it is; only the names defined in its __init__ move.
    for pkg in split:
        modules.pop(pkg)
    return Layout(root, paths, modules, split, old_modules, find_unknown(root))


def _has_code(path: Path) -> bool:
    """More in a module than its docstring."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body)


def find_unknown(root: Path) -> list[str]:
    """Modules and tests that are in neither table and not already in a package of the new layout."""
    placed = {new for new in MODULES.values()} | set(MODULES)
    new_dirs = {str(Path(new).parent) + "/" for new in MODULES.values()}
    unknown = []
    for path in sorted((root / "gpucloud").rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel in placed or any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in KEEP_MODULES):
            continue
        if path.name == "__init__.py" and str(path.parent.relative_to(root)) in PACKAGES:
            continue
        if any(rel.startswith(d) for d in new_dirs if d != "gpucloud/" and d != "gpucloud/providers/"):
            continue  # added inside a new package: already in place
        unknown.append(rel)
    for path in sorted((root / "tests").glob("test_*.py")):
        if path.name not in TESTS:
            unknown.append(str(path.relative_to(root)))
    return unknown


class Rewriter:
    """Maps module names, file paths and __file__-relative paths from the old layout to the new."""

    def __init__(self, layout: Layout) -> None:
        self.lay = layout
        self.dotted_re = re.compile(r"(?<![\w.])(?:gpucloud|tests)(?:\.\w+)+")
        self.path_re = re.compile(r"(?<![\w./-])((?:gpucloud|tests)/[\w/]+\.py)\b")
        self.doc_path_re = re.compile(r"(?<![\w./-])([\w/]+\.py)\b")
        names = [p.name for p in (layout.root / "gpucloud").rglob("*.py")]
        self.unique = {n for n in names if names.count(n) == 1}
        self.file_re = re.compile(r"Path\(__file__\)((?:\.resolve\(\))?)((?:\.parent\b)+|\.parents\[(\d+)\])")

    # -- module names -------------------------------------------------------------------------
    def module(self, name: str) -> str:
        """The new name of `name` (a module, or a name inside one); unchanged when nothing moved."""
        parts = name.split(".")
        for i in range(len(parts), 1, -1):
            prefix = ".".join(parts[:i])
            if prefix not in self.lay.old_modules:
                continue
            rest = parts[i:]
            if prefix in self.lay.split and rest:
                return ".".join([self.lay.split[prefix], *rest])
            if prefix in self.lay.modules:
                return ".".join([self.lay.modules[prefix], *rest])
            return name
        return name

    def is_module(self, name: str) -> bool:
        return name in self.lay.old_modules

    # -- one file ------------------------------------------------------------------------------
    def text(self, rel: str, text: str) -> str:
        edits: list[tuple[int, int, str]] = []
        protected: list[tuple[int, int]] = []
        if rel.endswith(".py"):
            try:
                tree = ast.parse(text)
            except SyntaxError:
                tree = None
            if tree is not None:
                self._python_imports(rel, text, tree, edits, protected)
        for m in self.dotted_re.finditer(text):
            if any(a <= m.start() < b for a, b in protected):
                continue
            new = self.module(m.group(0))
            if new != m.group(0):
                edits.append((m.start(), m.end(), new))
        for m in self.path_re.finditer(text):
            new = self.path(m.group(1))
            if new != m.group(1):
                edits.append((m.start(1), m.end(1), new))
        if rel.endswith(".py"):
            # A path spelled as joined segments: REPO / "gpucloud" / "cli_setup.py".
            for m in re.finditer(r'"(?:gpucloud|tests)"(?:\s*/\s*"[\w.]+")+', text):
                segments = re.findall(r'"([\w.]+)"', m.group(0))
                new = self.path("/".join(segments))
                if new != "/".join(segments):
                    edits.append((m.start(), m.end(), " / ".join(f'"{part}"' for part in new.split("/"))))
        if rel.endswith(".md"):
            for m in self.doc_path_re.finditer(text):
                short = m.group(1)
                if short.startswith(("gpucloud/", "tests/")):
                    continue
                if "/" not in short and short not in self.unique:
                    continue
                new = self.path(f"gpucloud/{short}")
                if new != f"gpucloud/{short}":
                    edits.append((m.start(1), m.end(1), new.removeprefix("gpucloud/")))
        if rel.endswith(".md"):
            for m in re.finditer(r"`(\w+_\w+)`", text):
                for folder in ("gpucloud", "gpucloud/providers"):
                    new = self.path(f"{folder}/{m.group(1)}.py")
                    if new != f"{folder}/{m.group(1)}.py":
                        edits.append((m.start(1), m.end(1), new.removeprefix("gpucloud/").removesuffix(".py")))
        if rel in self.lay.paths and rel.endswith(".py"):
            delta = len(Path(self.lay.paths[rel]).parts) - len(Path(rel).parts)
            if delta:
                for m in self.file_re.finditer(text):
                    n = int(m.group(3)) + 1 if m.group(3) is not None else m.group(2).count(".parent")
                    edits.append((m.start(), m.end(), f"Path(__file__){m.group(1)}{_parents(n + delta)}"))
        return _apply(text, edits)

    def ambiguous(self, texts: dict[str, str]) -> list[str]:
        """Bare file names in docs that a moved module shares with another: which one is meant needs a reader."""
        names = {Path(o).name for o in self.lay.paths if o.startswith("gpucloud/") and Path(o).name not in self.unique}
        names.discard("__init__.py")
        mine = self.lay.root / "tools" / "relayout_internals_map.md"
        written = set(mine.read_text(encoding="utf-8").splitlines()) if mine.is_file() else set()
        out = []
        for rel, text in sorted(texts.items()):
            if rel.endswith(".md"):
                for m in self.doc_path_re.finditer(text):
                    line_start = text.rfind("\n", 0, m.start()) + 1
                    line = text[line_start : text.find("\n", m.start())]
                    if m.group(1) in names and line not in written:
                        out.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)}")
        return out

    def path(self, rel: str) -> str:
        return self.lay.paths.get(rel, rel)

    def _python_imports(
        self, rel: str, text: str, tree: ast.AST, edits: list[tuple[int, int, str]], protected: list[tuple[int, int]]
    ) -> None:
        offsets = _line_offsets(text)
        here = dotted(rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in self.lay.split:
                        start = offsets[node.lineno - 1] + node.col_offset
                        end = offsets[(node.end_lineno or node.lineno) - 1] + (node.end_col_offset or 0)
                        segment = text[start:end]
                        fixed = re.sub(rf"\b{re.escape(alias.name)}\b(?!\.)", self.lay.split[alias.name], segment)
                        edits.append((start, end, fixed))
                        protected.append((start, end))
                continue
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                pkg = here.split(".") if rel.endswith("__init__.py") else here.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            if not (base == "gpucloud" or base.startswith(("gpucloud.", "tests"))):
                continue
            groups: dict[str, list[str]] = {}
            simple = True
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in self.lay.split:
                    target, leaf = self.lay.split[full].rsplit(".", 1)
                elif self.is_module(full):
                    target, leaf = self.module(full).rsplit(".", 1)
                else:
                    target, leaf = self._holder(base), alias.name
                as_name = alias.asname or (alias.name if leaf != alias.name else None)
                simple = simple and leaf == alias.name and as_name == alias.asname
                groups.setdefault(target, []).append(f"{leaf} as {as_name}" if as_name else leaf)
            start = offsets[node.lineno - 1] + node.col_offset
            end = offsets[(node.end_lineno or node.lineno) - 1] + (node.end_col_offset or 0)
            protected.append((start, end))
            if simple and len(groups) == 1 and not node.level:
                target = next(iter(groups))
                head = re.match(r"from\s+([\w.]+)", text[start:end])
                if head and target != base:
                    edits.append((start + head.start(1), start + head.end(1), target))
                continue
            if node.level and simple and list(groups) == [base] and rel not in self.lay.paths:
                continue  # a relative import whose file and target both stay
            indent = "\n" + " " * node.col_offset
            lines = [f"from {target} import {', '.join(names)}" for target, names in groups.items()]
            edits.append((start, end, indent.join(lines)))

    def _holder(self, base: str) -> str:
        """Where the names defined in module `base` live now."""
        if base in self.lay.split:
            return self.lay.split[base]
        return self.module(base)


def _parents(n: int) -> str:
    return ".parent" * n if n <= 2 else f".parents[{n - 1}]"


def _line_offsets(text: str) -> list[int]:
    out, pos = [], 0
    for line in text.splitlines(keepends=True):
        out.append(pos)
        pos += len(line)
    out.append(pos)
    return out


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    done_until = len(text) + 1
    for start, end, new in sorted(set(edits), key=lambda e: (e[0], e[1]), reverse=True):
        if end > done_until:
            continue  # overlaps an edit already made (a path inside a rewritten import)
        text = text[:start] + new + text[end:]
        done_until = start
    return text


def files_to_scan(root: Path) -> Iterable[str]:
    seen: set[str] = set()
    for top in SCAN_DIRS:
        base = root / top
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if not path.is_file() or any(p in ("node_modules", "__pycache__", ".venv") for p in path.parts):
                continue
            if path.suffix in TEXT_SUFFIXES or top == ".ci":
                seen.add(str(path.relative_to(root)))
    for name in SCAN_FILES:
        if (root / name).is_file():
            seen.add(name)
    tracked = set(_git(root, "ls-files").splitlines())
    return sorted(p for p in seen if p in tracked and p not in SELF)


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def patch_layers(text: str) -> str:
    start = text.find("LAYERS: dict[str, int] = {")
    if start < 0:
        return text
    end = text.index("\n}", start) + 2
    return text[:start] + LAYERS_BLOCK + text[end:]


def patch_internals(root: Path, text: str) -> str:
    """The Module map section from tools/relayout_internals_map.md, and the provider's file list."""
    source = root / "tools" / "relayout_internals_map.md"
    if not source.is_file() or MAP_START not in text or MAP_END not in text:
        return text
    new_map, _, files_part = source.read_text().partition("<!-- adding a provider -->\n")
    a = text.index(MAP_START)
    b = text.index(MAP_END)
    text = text[:a] + new_map.rstrip("\n") + "\n\n" + text[b:]
    if PROVIDER_FILES_MARK not in text and files_part.strip():
        b = text.index(MAP_END)
        nl = text.index("\n", b) + 1
        text = text[:nl] + files_part.rstrip("\n") + "\n\n" + text[nl:]
    return text


def run(root: Path, dry_run: bool) -> int:
    layout = scan(root)
    rw = Rewriter(layout)
    changed: dict[str, str] = {}  # new relpath -> new text
    for rel in files_to_scan(root):
        old_text = (root / rel).read_text(encoding="utf-8")
        new_text = rw.text(rel, old_text)
        if rel == "tests/test_structure.py":
            new_text = patch_layers(new_text)
        if rel == "docs/INTERNALS.md":
            new_text = patch_internals(root, new_text)
        if new_text != old_text or rel in layout.paths:
            changed[rw.path(rel)] = new_text
    for old, new in sorted(layout.paths.items()):
        print(f"move {old} -> {new}")
    if dry_run:
        print(f"{len(changed)} files would change")
    else:
        _move(root, layout)
        for rel, text in changed.items():
            (root / rel).write_text(text, encoding="utf-8")
        shared = share_fixtures(root)
        _tidy(root, sorted({p for p in changed if p.endswith(".py")} | shared))
        _git(root, "add", "-A", "--", *sorted({"gpucloud", "tests", *changed}))
        print(f"{len(layout.paths)} files moved, {len(changed)} files rewritten")
    for where in rw.ambiguous(changed):
        print(f"AMBIGUOUS DOC REFERENCE (several modules have this name; write its path by hand): {where}")
    for rel in layout.unknown:
        print(f"NOT IN ANY TABLE (add it to MODULES/KEEP_MODULES or TESTS): {rel}")
    return 1 if layout.unknown else 0


def _move(root: Path, layout: Layout) -> None:
    for old, new in sorted(layout.paths.items()):
        (root / new).parent.mkdir(parents=True, exist_ok=True)
        _git(root, "mv", old, new)
    for pkg, doc in PACKAGES.items():
        init = root / pkg / "__init__.py"
        init.parent.mkdir(parents=True, exist_ok=True)
        if not init.exists():
            init.write_text(f'"""{doc}"""\n', encoding="utf-8")
    for folder in sorted({str(Path(new).parent) for new in layout.paths.values() if new.startswith("tests/")}):
        f = Path(folder)
        while f != Path("tests"):
            init = root / f / "__init__.py"
            if not init.exists():
                init.write_text("", encoding="utf-8")
            f = f.parent


def _fixtures(path: Path) -> set[str]:
    """Names of the pytest fixtures a test module defines at its top level."""
    out = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if any(ast.unparse(d).startswith(("pytest.fixture", "fixture")) for d in node.decorator_list):
                out.add(node.name)
    return out


def _used_by_name(tree: ast.AST) -> set[str]:
    """Names a module reads other than as a parameter of the function reading it (a fixture is
    requested as a parameter; only a read of the module's own binding needs the import)."""
    used: set[str] = set()

    def visit(node: ast.AST, params: frozenset[str]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            params = params | {a.arg for a in every if a is not None}
        if isinstance(node, ast.Name) and node.id not in params:
            used.add(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child, params)

    visit(tree, frozenset())
    return used


def share_fixtures(root: Path) -> set[str]:
    """A fixture that test modules import from a sibling test module is imported once, by the
    folder's conftest.py, instead; each module keeps importing what it also uses by name. Returns
    the files changed."""
    changed: set[str] = set()
    for folder in sorted({p.parent for p in (root / "tests").rglob("test_*.py")}):
        if folder.name in ("support", "data"):
            continue
        package = ".".join(folder.relative_to(root).parts)
        wanted: dict[str, list[str]] = {}  # sibling module -> fixture names for conftest
        for path in sorted(folder.glob("test_*.py")):
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
            used = _used_by_name(tree)
            offsets = _line_offsets(text)
            edits: list[tuple[int, int, str]] = []
            for node in tree.body:
                if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package + ".")):
                    continue
                sibling = folder / (node.module.rsplit(".", 1)[1] + ".py")
                if node.module.count(".") != package.count(".") + 1 or not sibling.is_file():
                    continue
                fixtures = _fixtures(sibling)
                moved = [a for a in node.names if a.name in fixtures and not a.asname and a.name not in used]
                if not moved:
                    continue
                for a in moved:
                    if a.name not in wanted.setdefault(node.module, []):
                        wanted[node.module].append(a.name)
                kept = [a for a in node.names if a not in moved]
                start = offsets[node.lineno - 1]
                end = offsets[node.end_lineno or node.lineno]
                line = text[start:end]
                comment = "" if not kept or "noqa" not in line else "  # noqa: F401"
                names = ", ".join(f"{a.name} as {a.asname}" if a.asname else a.name for a in kept)
                edits.append((start, end, f"from {node.module} import {names}{comment}\n" if kept else ""))
            if edits:
                path.write_text(_apply(text, edits), encoding="utf-8")
                changed.add(str(path.relative_to(root)))
        if wanted:
            changed.add(_add_to_conftest(root, folder, wanted))
    return changed


def _add_to_conftest(root: Path, folder: Path, wanted: dict[str, list[str]]) -> str:
    conftest = folder / "conftest.py"
    lines = [f"from {module} import {', '.join(names)}  # noqa: F401" for module, names in sorted(wanted.items())]
    if conftest.is_file():
        text = conftest.read_text(encoding="utf-8")
        tree = ast.parse(text)
        imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        last = max((n.end_lineno or n.lineno for n in imports), default=0)
        head = text.splitlines(keepends=True)
        text = "".join(head[:last]) + "\n".join(lines) + "\n" + "".join(head[last:])
    else:
        doc = "Fixtures the tests of this folder share: defined once in a sibling test module, found here by pytest."
        text = f'"""{doc}"""\n\n' + "\n".join(lines) + "\n"
    conftest.write_text(text, encoding="utf-8")
    return str(conftest.relative_to(root))


def _tidy(root: Path, py_files: list[str]) -> None:
    """Import order and line breaks of the rewritten files, the way `ruff check`/`ruff format` want
    them; then the lines still over 120 columns (a longer module path in a string), to split by hand."""
    import importlib.util

    if importlib.util.find_spec("ruff"):
        ruff = [sys.executable, "-m", "ruff"]
    elif shutil.which("ruff"):
        ruff = [str(shutil.which("ruff"))]
    else:
        print("warning: ruff not found; run `ruff check --select I --fix . && ruff format .` yourself")
        return
    files = [f for f in py_files if (root / f).exists()]
    if not files:
        return
    subprocess.run([*ruff, "check", "--select", "I", "--fix", "-q", *files], cwd=root, check=False)
    subprocess.run([*ruff, "format", "-q", *files], cwd=root, check=False)
    long = subprocess.run(
        [*ruff, "check", "--select", "E501", "--output-format", "concise", "-q", *files],
        cwd=root,
        check=False,
        capture_output=True,
        text=True,
    )
    for line in long.stdout.splitlines():
        print(f"LINE OVER 120 after the rewrite (split it by hand): {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the moves and the files left out; change nothing")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: the current folder)")
    args = parser.parse_args()
    root = args.root.resolve()
    if not (root / "gpucloud").is_dir() or not (root / "tests").is_dir():
        print(f"error: {root} is not a gpucloud checkout (no gpucloud/ and tests/ folders)", file=sys.stderr)
        return 2
    return run(root, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
