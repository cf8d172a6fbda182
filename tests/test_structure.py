"""The code's shape, checked by reading the source (ast): module and function sizes, no import
circle, imports only point down the layers, and no cloud name spelled outside gpucloud/providers/
(docs/INTERNALS.md, "Module map")."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from gpucloud.contract import registry as providers
from tests.support.source_tree import package_dir

PKG = package_dir()  # the package under test: the checkout's, or the installed wheel's in CI
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
# The layers, bottom first: a module may import its own layer and the layers below, never one above.
# A module's layer is that of the longest prefix naming it ("gpucloud.spec.load" names gpucloud.spec.load and
# gpucloud.spec.load.models, not gpucloud.spec.values). When modules move into packages, only this table
# changes. Every module must be named here (a new one gets its layer on purpose).
FOUNDATION, STORES, CONTRACT, SPEC, PLAN, MACHINES, UI, RUN, CLI = range(9)
LAYERS: dict[str, int] = {
    # import-free ground: errors, pure data, the VM wire format
    "gpucloud.errors": FOUNDATION,
    "gpucloud.child_env": FOUNDATION,
    "gpucloud.plan.stack_data": FOUNDATION,
    "gpucloud.channel.extract": FOUNDATION,
    "gpucloud.channel.trust": FOUNDATION,
    "gpucloud.ui.timeline": FOUNDATION,
    "gpucloud.prose": FOUNDATION,
    "gpucloud.ui.untrusted": FOUNDATION,
    "gpucloud.state.records": FOUNDATION,
    "gpucloud.vm.protocol": FOUNDATION,
    "gpucloud.vm.agent": FOUNDATION,
    "gpucloud.vm.env": FOUNDATION,
    # where things are kept: the state store, the run's object store
    "gpucloud.state": STORES,
    "gpucloud.channel": STORES,
    # what crosses between the core and a provider: the registry, the contract, the catalog's rows
    "gpucloud.contract": CONTRACT,
    "gpucloud.catalog": CONTRACT,
    # the job file
    "gpucloud.spec": SPEC,
    # the plan: stacks, images, candidates
    "gpucloud.plan": PLAN,
    # the machines: provider implementations, the VM's user-data and the local VM engine
    "gpucloud.providers": MACHINES,
    "gpucloud.vm": MACHINES,
    # what the user reads: plans, statuses, progress, JSON and CI output (a run reports through them)
    "gpucloud.ui": UI,
    # one run from launch to teardown, and the commands around runs
    "gpucloud.run": RUN,
    # the command line
    "gpucloud.cli": CLI,
    "gpucloud.__main__": CLI,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _import_statements(name: str, path: Path) -> Iterator[tuple[ast.Import | ast.ImportFrom, str, list[str]]]:
    """Every import statement of module `name` (at the top, in a function, under TYPE_CHECKING) as
    (statement, base, full names): `import a.b` gives ("", ["a.b"]); `from .m import x` gives the
    absolute module and ["<module>.x"], a relative import resolved from `name`'s package. The one
    walker under the import checks: layers and circles, private names, and tests importing tests."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield node, "", [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            yield node, base, [f"{base}.{a.name}" for a in node.names]


def _imports(name: str, path: Path, known: set[str], bare: frozenset[str] = frozenset()) -> set[str]:
    """gpucloud modules `name` imports anywhere: at the top, in a function, or under `if TYPE_CHECKING:`
    (a type-only import is still a dependency of the code's meaning), with the parent packages that
    importing them runs. A package whose `__init__` imports no gpucloud module (a plain folder marker,
    in `bare`) runs nothing, so passing through it is no dependency."""
    found: set[str] = set()
    for node, base, names in _import_statements(name, path):
        targets = names
        # `from pkg import module` names pkg only on the way to the module.
        if isinstance(node, ast.ImportFrom) and not any(s in known for s in names):
            targets = [base, *names]
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                mod = ".".join(parts[:i])
                # Importing a.b.c runs a and a.b first, unless the importer is inside them already.
                inside = name == mod or name.startswith(mod + ".")
                passed_through = i < len(parts)
                if mod in known and not inside and mod != "gpucloud" and not (passed_through and mod in bare):
                    found.add(mod)
    return found


def _bare_packages(mods: dict[str, Path]) -> frozenset[str]:
    """Packages whose `__init__` imports no gpucloud module: folder markers, outside the layers."""
    return frozenset(
        name for name, path in mods.items() if path.name == "__init__.py" and not _imports(name, path, set(mods))
    )


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    bare = _bare_packages(mods)
    return {name: _imports(name, path, set(mods), bare) for name, path in mods.items()}


def test_no_module_over_600_lines_and_no_function_over_60() -> None:
    too_long = []
    for name, path in _modules().items():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {size} lines")
    assert not too_long, too_long


def test_no_import_circle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []
    circles: list[str] = []

    def visit(mod: str) -> None:
        state[mod] = 1
        path.append(mod)
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                circles.append(" -> ".join([*path[path.index(dep) :], dep]))
            elif dep not in state:
                visit(dep)
        path.pop()
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod)
    assert not circles, circles


def layer_of(module: str) -> int | None:
    """The layer of the longest LAYERS prefix naming `module`, or None when none does."""
    best: tuple[int, int] | None = None
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), layer)
    return best[1] if best else None


def test_every_module_has_a_layer() -> None:
    mods = _modules()
    bare = _bare_packages(mods)
    missing = [m for m in mods if m != "gpucloud" and m not in bare and layer_of(m) is None]
    assert not missing, f"give these modules a layer in LAYERS: {missing}"


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import in `graph` that runs from a module to one in a higher layer."""
    wrong = []
    for mod, deps in sorted(graph.items()):
        here = layer_of(mod)
        for dep in sorted(deps):
            there = layer_of(dep)
            if here is not None and there is not None and there > here:
                wrong.append(f"{mod} (layer {here}) imports {dep} (layer {there})")
    return wrong


def test_imports_point_down_the_layers() -> None:
    wrong = _upward(_graph())
    assert not wrong, "\n".join(wrong)


# The top-level folders, bottom first: an import from one folder into another runs down this table
# (or stays level), unless what it imports is foundation (layer 0 in LAYERS: import-free ground that
# every layer may use, wherever it lives). Every top-level module and folder must be named here.
FOLDERS: dict[str, int] = {
    "gpucloud.errors": FOUNDATION,
    "gpucloud.child_env": FOUNDATION,
    "gpucloud.prose": FOUNDATION,
    "gpucloud.state": STORES,
    "gpucloud.channel": STORES,
    "gpucloud.contract": CONTRACT,
    "gpucloud.catalog": CONTRACT,
    "gpucloud.spec": SPEC,
    "gpucloud.plan": PLAN,
    "gpucloud.providers": MACHINES,
    "gpucloud.vm": MACHINES,
    "gpucloud.ui": UI,
    "gpucloud.run": RUN,
    "gpucloud.cli": CLI,
    "gpucloud.__main__": CLI,
}
# What a provider package may import outside gpucloud/providers/ (besides foundation modules).
PROVIDERS_IMPORT = ("gpucloud.contract", "gpucloud.catalog", "gpucloud.state", "gpucloud.channel", "gpucloud.errors")
# What a folder below ui/ may take from ui/: the fence around text from machines (every layer prints it).
UI_FOR_ALL = ("gpucloud.ui.untrusted",)
# The folders that ask for a capability and never name the cloud that has it.
CLOUD_BLIND = ("gpucloud.run", "gpucloud.vm", "gpucloud.plan")


def _folder(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _folder_back_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Every import in `graph` from one top-level folder into a higher one (foundation modules aside),
    from a provider package to anything but the contract, the catalog and the stores, and from run/,
    vm/ or plan/ to any provider package."""
    wrong = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            here, there = _folder(mod), _folder(dep)
            if there == "gpucloud.ui" and FOLDERS[here] < UI and not _under(dep, UI_FOR_ALL):
                wrong.append(f"{mod} ({here}) imports {dep}: below ui/ only {', '.join(UI_FOR_ALL)}")
                continue
            if here == there or layer_of(dep) == FOUNDATION:
                continue
            if FOLDERS[there] > FOLDERS[here]:
                wrong.append(f"{mod} ({here}, {FOLDERS[here]}) imports {dep} ({there}, {FOLDERS[there]})")
            elif here == "gpucloud.providers" and not _under(dep, PROVIDERS_IMPORT):
                wrong.append(f"{mod} (a provider) imports {dep}: only the contract, the catalog and the stores")
            elif _under(mod, CLOUD_BLIND) and there == "gpucloud.providers":
                wrong.append(f"{mod} names a provider: it imports {dep} (ask gpucloud/contract/registry.py)")
    return wrong


def test_imports_point_down_the_folders() -> None:
    """Folders are layers too: counting every import (module-level, in a function, type-only)."""
    unnamed = sorted({_folder(m) for m in _modules() if m != "gpucloud"} - set(FOLDERS))
    assert not unnamed, f"give these folders a rank in FOLDERS: {unnamed}"
    wrong = _folder_back_arrows(_graph())
    assert not wrong, "\n".join(wrong)


def test_the_folder_check_sees_seeded_back_arrows(tmp_path: Path) -> None:
    """A provider reaching into the planner (even lazily, in a function), run/ importing a cloud's
    module (even type-only), and a provider importing ui/ are each caught; foundation is not."""
    probe = tmp_path / "probe.py"
    probe.write_text("def assess():\n    from gpucloud.plan.stacks import resolve_stack\n")
    grants = tmp_path / "grants.py"
    grants.write_text("import typing\nif typing.TYPE_CHECKING:\n    from gpucloud.providers.aws import data\n")
    known = {"gpucloud.plan.stacks", "gpucloud.providers.aws.data", "gpucloud.plan.stack_data"}
    graph = {
        "gpucloud.providers.ssh.probe": _imports("gpucloud.providers.ssh.probe", probe, known),
        "gpucloud.run.data_grants": _imports("gpucloud.run.data_grants", grants, known),
        "gpucloud.providers.aws.provider": {"gpucloud.ui.views", "gpucloud.plan.stack_data"},
        "gpucloud.vm.render": {"gpucloud.providers.local.provider", "gpucloud.contract.registry"},
    }
    wrong = _folder_back_arrows(graph)
    assert [w.split(" ")[0] for w in wrong] == [
        "gpucloud.providers.aws.provider",
        "gpucloud.providers.ssh.probe",
        "gpucloud.run.data_grants",
        "gpucloud.vm.render",
    ], wrong
    assert "gpucloud.plan.stacks" in wrong[1] and "names a provider" in wrong[2] and "names a provider" in wrong[3]
    assert _folder_back_arrows({"gpucloud.providers.ssh.probe": {"gpucloud.plan.stack_data"}}) == []


def test_below_ui_only_the_untrusted_fence_is_imported_from_ui() -> None:
    """A store or a provider printing through ui/ (even a foundation module there) is caught; the
    fence around untrusted text is not, and neither is foundation outside ui/."""
    graph = {
        "gpucloud.state.guard": {"gpucloud.ui.timeline", "gpucloud.prose"},
        "gpucloud.providers.aws.provider": {"gpucloud.ui.untrusted", "gpucloud.errors"},
        "gpucloud.run.collect": {"gpucloud.ui.views"},
    }
    wrong = _folder_back_arrows(graph)
    assert [w.split(" ")[0] for w in wrong] == ["gpucloud.state.guard"], wrong
    assert "gpucloud.ui.timeline" in wrong[0]


def test_no_bucket_scheme_spelled_in_run_vm_plan() -> None:
    """run/, vm/ and plan/ switch on no store kind: a bucket's store is found by its scheme through
    the registry. The node's agent (vm/agent/) carries out each store's grant and is left out."""
    schemes = {s for s in (providers.info(n).bucket_scheme for n in providers.names()) if s}
    spelled = []
    for mod, path in _modules().items():
        if not _under(mod, CLOUD_BLIND) or _under(mod, ("gpucloud.vm.agent",)):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in schemes:
                spelled.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: {node.value!r}")
    assert not spelled, spelled


def test_the_checker_sees_a_circle_and_lazy_imports(tmp_path: Path) -> None:
    """The import walker itself: lazy (function-level) and type-only (TYPE_CHECKING) imports count."""
    a = tmp_path / "a.py"
    a.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gpucloud.typed\n"
        "def f():\n    from gpucloud import lazy\n"
    )
    assert _imports("gpucloud.a", a, {"gpucloud.lazy", "gpucloud.typed"}) == {"gpucloud.lazy", "gpucloud.typed"}


def test_a_bare_package_on_the_way_is_no_dependency(tmp_path: Path) -> None:
    """`from gpucloud.pkg import mod` depends on pkg only when pkg's `__init__` imports something."""
    a = tmp_path / "a.py"
    a.write_text("from gpucloud.pkg import mod\nimport gpucloud.other.thing\n")
    known = {"gpucloud.pkg", "gpucloud.pkg.mod", "gpucloud.other", "gpucloud.other.thing"}
    assert _imports("gpucloud.a", a, known, frozenset({"gpucloud.pkg", "gpucloud.other"})) == {
        "gpucloud.pkg.mod",
        "gpucloud.other.thing",
    }
    assert _imports("gpucloud.a", a, known) == known


def test_the_layer_table_reads_prefixes() -> None:
    """Longest prefix wins; a prefix names a module and its submodules, not a longer name."""
    assert layer_of("gpucloud.providers.aws.launch") == MACHINES
    assert layer_of("gpucloud.contract.provider") == CONTRACT
    assert layer_of("gpucloud.contract") == CONTRACT
    assert layer_of("gpucloud.providers") == MACHINES
    assert layer_of("gpucloud.ui.catalog") == UI
    assert layer_of("gpucloud.statefoo") is None
    assert _upward(
        {
            "gpucloud.contract.provider": {"gpucloud.plan.planner"},
            "gpucloud.plan.planner": {"gpucloud.contract.provider"},
        }
    ) == [f"gpucloud.contract.provider (layer {CONTRACT}) imports gpucloud.plan.planner (layer {PLAN})"]


OPENSSH_PROGRAMS = {"ssh"}


def _provider_names_spelled(path: Path, names: set[str]) -> list[str]:
    """Where `path` spells a provider's name as a string constant (OpenSSH's client as the program
    of an argv list is the program, not the provider)."""
    tree = ast.parse(path.read_text())
    programs = {
        id(lst.elts[0])
        for lst in ast.walk(tree)
        if isinstance(lst, ast.List)
        and lst.elts
        and isinstance(lst.elts[0], ast.Constant)
        and lst.elts[0].value in OPENSSH_PROGRAMS
    }
    return [
        f"{path.name}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if id(node) not in programs
        and isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.lower() in names
    ]


def test_no_cloud_name_spelled_outside_providers() -> None:
    """Only the registry (gpucloud/contract/registry.py) and the provider packages (and data files)
    name a provider: a new provider is one package, one registry entry and data rows."""
    names = set(providers.names())
    spelled = [
        f"{mod}: {hit}"
        for mod, path in _modules().items()
        if not (mod.startswith("gpucloud.providers") or mod == "gpucloud.contract.registry")
        for hit in _provider_names_spelled(path, names)
    ]
    assert not spelled, spelled


def test_the_provider_name_check_sees_a_seeded_name_in_run(tmp_path: Path) -> None:
    """A run/ module switching on a cloud's name (any case) is caught; ssh as an argv's program is not."""
    seeded = tmp_path / "grants.py"
    seeded.write_text(
        "def grant(kind):\n    if kind == 'AWS':\n        return ['ssh', '-o', 'BatchMode=yes']\n"
        "    return {'azure': 1}.get(kind, kind == 'ssh')\n"
    )
    assert sorted(_provider_names_spelled(seeded, set(providers.names()))) == [
        "grants.py:2: 'AWS'",
        "grants.py:4: 'azure'",
        "grants.py:4: 'ssh'",
    ]


def _private_imports(name: str, path: Path) -> list[str]:
    """Private (`_x`) names `name` takes from another gpucloud module, anywhere in the file (lazy
    and TYPE_CHECKING imports count): what is shared is public, so a module's privates stay free to
    change without reading the rest of the package."""
    found = []
    for node, base, names in _import_statements(name, path):
        for full in names:
            if (
                full.startswith("gpucloud.")
                and base != name
                and any(p.startswith("_") and not p.startswith("__") for p in full.split("."))
            ):
                found.append(f"{name}:{node.lineno}: {full}")
    return found


def test_no_private_name_imported_from_another_module() -> None:
    bad = [hit for mod, path in _modules().items() for hit in _private_imports(mod, path)]
    assert not bad, bad


def test_the_private_import_check_sees_lazy_typed_and_relative_imports(tmp_path: Path) -> None:
    a = tmp_path / "a.py"
    a.write_text(
        "from typing import TYPE_CHECKING\nfrom gpucloud.b import public\nfrom gpucloud.a import _own\n"
        "if TYPE_CHECKING:\n    from gpucloud.b import _Typed\n"
        "def f():\n    from .c import _lazy\n    import gpucloud._hidden\n"
    )
    assert _private_imports("gpucloud.a", a) == [
        "gpucloud.a:5: gpucloud.b._Typed",
        "gpucloud.a:7: gpucloud.c._lazy",
        "gpucloud.a:8: gpucloud._hidden",
    ]


# The contract's callers: they call what the contract declares, never look an optional method up.
CONTRACT_CALLERS = ("gpucloud.plan", "gpucloud.run", "gpucloud.cli")


def _implemented_methods(mods: dict[str, Path]) -> set[str]:
    """Method names of the classes in gpucloud/providers/ and gpucloud/catalog/ (the contract's
    implementations: providers, row sources, stores)."""
    names = set()
    for mod, path in mods.items():
        if _under(mod, ("gpucloud.providers", "gpucloud.catalog")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    names |= {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


def _looked_up_methods(name: str, path: Path, methods: set[str]) -> list[str]:
    """`getattr(x, "m")` / `hasattr(x, "m")` where m is an implementation's method: an optional method
    found by reflection instead of declared on the contract with a default."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in methods
        ):
            found.append(f"{name}:{node.lineno}: {node.func.id} {node.args[1].value!r}")
    return found


def test_no_optional_method_looked_up_by_name() -> None:
    mods = _modules()
    methods = _implemented_methods(mods)
    bad = [
        hit
        for mod, path in mods.items()
        if _under(mod, CONTRACT_CALLERS)
        for hit in _looked_up_methods(mod, path, methods)
    ]
    assert not bad, bad


def test_the_method_lookup_check_sees_getattr_and_hasattr(tmp_path: Path) -> None:
    """A planner asking a row source for `split_clean` by name, or a run asking a provider whether it
    can `stop`, is caught; a lookup of anything else (an exception's field) is not."""
    a = tmp_path / "a.py"
    a.write_text(
        'split = getattr(cat.rows, "split_clean", None)\nif hasattr(provider, "stop"):\n    pass\n'
        'code = getattr(exc, "exit_code", 70)\n'
    )
    assert _looked_up_methods("gpucloud.plan.rows", a, {"split_clean", "stop"}) == [
        "gpucloud.plan.rows:1: getattr 'split_clean'",
        "gpucloud.plan.rows:2: hasattr 'stop'",
    ]
    assert {"split_clean", "stop", "plan_notes"} <= _implemented_methods(_modules())


def _undeclared_calls(name: str, path: Path) -> list[str]:
    """A method call whose missing attribute is silenced (`x.m(...)  # type: ignore[attr-defined]`):
    a method one provider has and the contract does not declare."""
    return [
        f"{name}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "type: ignore[attr-defined]" in line and re.search(r"\.\w+\(", line.split("#")[0])
    ]


def test_no_undeclared_method_called_with_a_silenced_type_check() -> None:
    bad = [
        hit for mod, path in _modules().items() if _under(mod, CONTRACT_CALLERS) for hit in _undeclared_calls(mod, path)
    ]
    assert not bad, bad


def test_the_undeclared_call_check_sees_a_silenced_method_call(tmp_path: Path) -> None:
    """An SSH-only `probe` called on a provider with its type check silenced is caught; a silenced
    assignment of an attribute (no call) is not."""
    a = tmp_path / "a.py"
    a.write_text(
        "probes = host_provider.probe(hosts, asks)  # type: ignore[attr-defined]\n"
        "f.cache_clear = g  # type: ignore[attr-defined]\nx = provider.plan_notes()\n"
    )
    assert _undeclared_calls("gpucloud.cli.setup", a) == [
        "gpucloud.cli.setup:1: probes = host_provider.probe(hosts, asks)  # type: ignore[attr-defined]"
    ]


# Shared test code lives in tests/support/ (or a conftest), so a test module is never imported by another.
TESTS = Path(__file__).resolve().parent


def _test_imports(path: Path, name: str) -> list[str]:
    """The modules under tests/ that `path` (module `name`) imports, anywhere in it, other than
    tests.support.* and a conftest: `from tests.spec import fuzzing` counts as tests.spec.fuzzing."""
    found = []
    for node, base, names in _import_statements(name.removesuffix(".__init__"), path):
        targets = names
        if isinstance(node, ast.ImportFrom) and not TESTS.parent.joinpath(*base.split(".")).is_dir():
            targets = [base]
        for target in targets:
            parts = target.split(".")
            if parts[0] == "tests" and parts[1:2] != ["support"] and "conftest" not in parts:
                found.append(target)
    return found


def test_no_test_module_imports_another() -> None:
    wrong = [
        f"{path.relative_to(TESTS.parent)}: {target}"
        for path in sorted(TESTS.rglob("*.py"))
        for target in _test_imports(path, ".".join(path.relative_to(TESTS.parent).with_suffix("").parts))
    ]
    assert not wrong, "move what is shared into a tests/support/ module:\n" + "\n".join(wrong)


def test_the_test_import_check_sees_seeded_imports(tmp_path: Path) -> None:
    seeded = tmp_path / "test_seeded.py"
    seeded.write_text(
        "from tests.support.cli import cli\nfrom tests.vm.conftest import APT\nimport tests.conftest\n"
        "from tests.support import job_fuzzer\nfrom tests.run.test_spot import run_log\n"
        "import tests.vm.test_render\ndef later():\n    from tests.spec import fuzzing\n"
        "    from .test_other import x\n"
    )
    assert _test_imports(seeded, "tests.run.test_seeded") == [
        "tests.run.test_spot",
        "tests.vm.test_render",
        "tests.spec.fuzzing",
        "tests.run.test_other",
    ]


def _cli_helpers(path: Path) -> list[str]:
    """Where `path` defines a function named cli (at any depth): the CLI is started by one helper."""
    text = path.read_text()
    if "def cli(" not in text:
        return []
    tree = ast.parse(text)
    return [f"{path.name}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "cli"]


def _outside_cli_home(find: Callable[[Path], list[str]]) -> str:
    """`find`'s hits in every test file but tests/support/cli.py, one a line."""
    home = TESTS / "support" / "cli.py"
    return "\n".join(hit for path in sorted(TESTS.rglob("*.py")) if path != home for hit in find(path))


def test_one_cli_helper_for_every_test_module() -> None:
    wrong = _outside_cli_home(_cli_helpers)
    assert not wrong, f"start the CLI with tests/support/cli.py's cli (its env, cwd, module arguments):\n{wrong}"


def test_the_cli_helper_check_sees_a_seeded_copy(tmp_path: Path) -> None:
    seeded = tmp_path / "test_seeded.py"
    seeded.write_text("def cli(*args):\n    pass\nclass T:\n    def cli(self):\n        pass\n")
    assert _cli_helpers(seeded) == ["test_seeded.py:1", "test_seeded.py:4"]


def _own_cli_runs(path: Path) -> list[str]:
    """Where `path` waits for the CLI with its own `subprocess.run([sys.executable, "-m", "gpucloud..."])`
    instead of cli() (a Popen that a test reads, signals or kills is left to it)."""
    text = path.read_text()
    if "subprocess.run(" not in text:
        return []
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "subprocess.run" and node.args:
            argv = node.args[0]
            if (
                isinstance(argv, ast.List)
                and len(argv.elts) > 2
                and ast.unparse(argv.elts[0]) == "sys.executable"
                and isinstance(argv.elts[2], ast.Constant)
                and str(argv.elts[2].value).startswith("gpucloud")
            ):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_every_test_waits_for_the_cli_through_cli() -> None:
    wrong = _outside_cli_home(_own_cli_runs)
    assert not wrong, f"run the CLI with tests/support/cli.py's cli (env, cwd, timeout, module, text):\n{wrong}"


def test_the_own_cli_run_check_sees_a_seeded_run(tmp_path: Path) -> None:
    seeded = tmp_path / "test_seeded.py"
    seeded.write_text(
        "import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'gpucloud', 'plan'])\n"
        "subprocess.run([sys.executable, '-m', 'gpucloud.ui.ci', 'x'], check=True)\n"
        "subprocess.run([sys.executable, '-c', 'pass'])\nsubprocess.Popen([sys.executable, '-m', 'gpucloud'])\n"
    )
    assert _own_cli_runs(seeded) == ["test_seeded.py:2", "test_seeded.py:3"]
