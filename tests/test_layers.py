"""The house's layering holds (docs/architecture.md): every import, at module level or
inside a function, absolute or relative, runs from a higher layer down to a lower one, and
no modules import each other in a circle. Imports are read from the code with ast, not
from a list."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

PACKAGE = Path(__file__).resolve().parent.parent / "kafkatunnel"

# Each part of the package and its layer: a part imports only parts of lower layers (and
# its own modules, without a circle). Written once, here.
LAYERS = {
    "__init__": 0,  # the version, nothing else
    "waiting": 0, "pids": 0, "files": 0, "hostnames": 0, "ratelimit": 0, "client_settings": 0,
    "protocol": 1,
    "capture": 2, "dns": 2, "probe": 2,
    "tunnel": 3, "verify": 3, "privileges": 3, "isolated_groups": 3,
    "kube": 4, "demo": 4,
    "doctor": 5,
    "cli": 6,
    "__main__": 7,
}  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_from(node: ast.ImportFrom, importer: Path) -> str:
    """The absolute name of the module a `from ... import` reads, relative (`from ..tunnel
    import x` in kafkatunnel/cli/main.py: kafkatunnel.tunnel) or not."""
    if node.level == 0:
        return node.module or ""
    package = module_name(importer).split(".")
    if importer.name != "__init__.py":  # a module's own package holds it
        package = package[:-1]
    base = package[: max(len(package) - (node.level - 1), 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> dict[str, set[str]]:
    """Module -> the kafkatunnel modules it imports, wherever in it the import stands."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = imported_from(node, path)
                for alias in node.names:  # `from pkg import module` names a module
                    target = f"{base}.{alias.name}"
                    found.add(target if target in modules else base)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_every_part_has_a_layer() -> None:
    parts = {part_of(m) for m in imports()}
    assert parts <= set(LAYERS), f"give these a layer in LAYERS: {sorted(parts - set(LAYERS))}"
    assert set(LAYERS) <= parts, f"no longer in the package: {sorted(set(LAYERS) - parts)}"


def test_the_package_imports_nothing_of_the_tests_or_the_scripts() -> None:
    """The tests' worlds (tests/worlds: Kubernetes, Keycloak, Strimzi's pods, the CAs) and
    the scripts do not ship: the product runs without them, and the demo with what the
    package holds."""
    outside = {"tests", "scripts"}
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            wrong += [f"{module_name(path)} imports {name}" for name in names
                      if name.split(".")[0] in outside]  # fmt: skip
    assert wrong == [], "\n".join(wrong)


def test_imports_run_down_the_layers() -> None:
    upward = [
        f"{source} -> {target}"
        for source, targets in imports().items()
        for target in targets
        if part_of(source) != part_of(target) and LAYERS[part_of(source)] <= LAYERS[part_of(target)]
    ]
    assert not upward, "imports that run up or across the layers:\n" + "\n".join(upward)


def test_no_import_circles() -> None:
    graph = imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_no_private_module_of_another_package_is_imported() -> None:
    """A library's private modules (typer._click, say) change without notice: the package
    uses only public names."""
    private = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if not name.startswith("kafkatunnel") and any(
                    part.startswith("_") and part != "__future__" for part in name.split(".")
                ):
                    private.append(f"{module_name(path)} imports {name}")
    assert private == []


def test_callers_of_the_protocol_package_import_only_its_public_names() -> None:
    """kafkatunnel.protocol's modules are its own business: the tunnel, the recorder, the
    verifier, the scripts and the tests of anything else use the names it exports. (Its
    own tests, in tests/protocol, test its modules.)"""
    import kafkatunnel.protocol

    public = set(kafkatunnel.protocol.__all__)
    root = PACKAGE.parent
    inside = (PACKAGE / "protocol", root / "tests" / "protocol")
    callers = [
        path
        for folder in (PACKAGE, root / "scripts", root / "tests")
        for path in folder.rglob("*.py")
        if not any(path.is_relative_to(own) for own in inside)
    ]
    assert len(callers) > 100  # the whole house was read
    wrong = []
    for path in callers:
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                wrong += [
                    f"{where}: import {a.name}"
                    for a in node.names
                    if a.name.startswith("kafkatunnel.protocol.")
                ]
            elif isinstance(node, ast.ImportFrom):
                module = imported_from(node, path)
                if module.startswith("kafkatunnel.protocol."):
                    wrong.append(f"{where}: from {module} import ...")
                elif module == "kafkatunnel.protocol":
                    wrong += [
                        f"{where}: {a.name} is not in kafkatunnel.protocol.__all__"
                        for a in node.names
                        if a.name not in public
                    ]
    assert wrong == [], "\n".join(wrong)
