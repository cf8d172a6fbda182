"""The code's shape, checked by reading the source (ast): module and function sizes, no import
circle, imports only point down the layers, and no cloud name spelled outside gpucloud/providers/
(docs/INTERNALS.md, "Module map")."""

from __future__ import annotations

import ast
from pathlib import Path

from gpucloud import providers
from tests.support.source_tree import package_dir

PKG = package_dir()  # the package under test: the checkout's, or the installed wheel's in CI
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# module prefix -> modules it must never import (a lower layer pointing back up)
FORBIDDEN = {
    "gpucloud.providers": (
        "gpucloud.lifecycle",
        "gpucloud.failover",
        "gpucloud.watch",
        "gpucloud.teardown",
        "gpucloud.commands",
        "gpucloud.cli",
        "gpucloud.views",
    ),
    "gpucloud.state": ("gpucloud.providers", "gpucloud.lifecycle", "gpucloud.commands"),
    "gpucloud.render": ("gpucloud.lifecycle", "gpucloud.failover", "gpucloud.commands"),
    "gpucloud.watch": ("gpucloud.lifecycle", "gpucloud.commands", "gpucloud.failover"),
    "gpucloud.teardown": ("gpucloud.lifecycle", "gpucloud.commands", "gpucloud.failover"),
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


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of import nodes under `if TYPE_CHECKING:` (never executed)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """gpucloud modules `name` imports at run time (lazy ones included), with their parent packages."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                mod = ".".join(parts[:i])
                # Importing a.b.c runs a and a.b first, unless the importer is inside them already.
                inside = name == mod or name.startswith(mod + ".")
                if mod in known and not inside and mod != "gpucloud":
                    found.add(mod)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, set(mods)) for name, path in mods.items()}


def test_no_module_over_600_lines_and_no_function_over_80() -> None:
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


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for mod, deps in _graph().items():
        for prefix, banned in FORBIDDEN.items():
            if mod == prefix or mod.startswith(prefix + "."):
                wrong += [f"{mod} imports {d}" for d in deps if any(d == b or d.startswith(b + ".") for b in banned)]
    assert not wrong, wrong


def test_the_checker_sees_a_circle_and_lazy_imports(tmp_path: Path) -> None:
    """The import walker itself: lazy (function-level) imports count, TYPE_CHECKING ones do not."""
    a = tmp_path / "a.py"
    a.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gpucloud.views\n"
        "def f():\n    from gpucloud import state\n"
    )
    assert _imports("gpucloud.a", a, {"gpucloud.state", "gpucloud.views"}) == {"gpucloud.state"}


def test_no_cloud_name_spelled_outside_providers() -> None:
    """Only the registry and the provider modules (and data files) name a provider: a new provider
    is one module, one registry entry and data rows."""
    names = set(providers.names())
    spelled = []
    for mod, path in _modules().items():
        if mod.startswith("gpucloud.providers"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in names:
                spelled.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: {node.value!r}")
    assert not spelled, spelled
