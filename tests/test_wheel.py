"""What `pip wheel .` builds is the product: the package's own modules and nothing of the
tests' worlds (tests/worlds: Kubernetes, Keycloak, Strimzi's pods, the certificate
authorities, the recorded sessions), and every module in it imports only the standard
library, the package itself and what the wheel requires. Built offline, from the source
tree, as a user's `pip install .` builds it."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kafkatunnel"
WORLDS = ROOT / "tests" / "worlds"
# A world's module whose name a product module shares, and why the product has one.
SHARED = {"apache": "the demo's Apache Kafka, on which the tests' with Strimzi's listeners builds"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--wheel-dir", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, (
        f"pip wheel failed (is hatchling installed? pip install -e '.[dev]'):\n{built.stderr}"
    )
    [path] = out.glob("kafkatunnel-*.whl")
    return zipfile.ZipFile(path)


def module_of(path: str) -> str:
    """kafkatunnel/demo/__init__.py -> kafkatunnel.demo; kafkatunnel/cli/main.py ->
    kafkatunnel.cli.main."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(wheel: zipfile.ZipFile) -> dict[str, str]:
    """Module name -> its path in the wheel."""
    return {module_of(name): name for name in wheel.namelist() if name.endswith(".py")}


def test_the_wheel_holds_the_package_and_nothing_else(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"kafkatunnel"}, tops
    source = {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py")}
    assert set(modules(wheel).values()) == source


def test_no_world_of_the_tests_is_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    worlds = {p.stem for p in WORLDS.glob("*.py")} - {"__init__"}
    assert {"kubernetes", "keycloak", "strimzi_pods", "authority"} <= worlds  # read them all
    shipped = {name.rsplit(".", 1)[-1] for name in modules(wheel)}
    assert shipped & (worlds - set(SHARED)) == set()
    # the demo's Apache Kafka listens in plaintext: TLS, SASL and OAuth are the tests' own
    demo_apache = wheel.read("kafkatunnel/demo/apache.py").decode()
    assert re.findall(r"(?i)ssl|sasl|scram|oauth|keycloak|authority", demo_apache) == []


def requirements(wheel: zipfile.ZipFile) -> set[str]:
    """The distributions a user's installation can hold: what the wheel requires (with
    its extras, not `dev`), and what they require in turn, as installed here."""
    [metadata] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    wanted = [
        line.removeprefix("Requires-Dist:").strip()
        for line in wheel.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:") and "extra == 'dev'" not in line.replace('"', "'")
    ]
    found: set[str] = set()
    while wanted:
        name = normalized(re.split(r"[\s;<>=!~\[(]", wanted.pop(), maxsplit=1)[0])
        if name in found:
            continue
        found.add(name)
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not for this platform (uvloop on Windows), or not installed here
        wanted += [r for r in requires if "extra ==" not in r]
    return found


def normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def imported(node: ast.AST, package: str) -> list[str]:
    """The modules an import statement in `package` reads: `from a import b` reads a.b when
    a is a package without an __init__.py (whose names are its modules), else a."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative, within the package
        parts = package.split(".")
        base = ".".join([*parts[: len(parts) - (node.level - 1)], *([base] if base else [])])
    return [base, *(f"{base}.{a.name}" for a in node.names)]


def test_every_module_in_the_wheel_imports_only_the_product_and_what_it_requires(
    wheel: zipfile.ZipFile,
) -> None:
    shipped = modules(wheel)
    folders = {".".join(m.split(".")[:n]) for m in shipped for n in range(1, m.count(".") + 1)}
    required = requirements(wheel)
    assert {"typer", "confluent-kafka", "pyspark", "py4j"} <= required  # extras, and theirs
    importable = {
        top
        for top, distributions in importlib.metadata.packages_distributions().items()
        if any(normalized(d) in required for d in distributions)
    }
    wrong = []
    for module, path in sorted(shipped.items()):
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(wheel.read(path))):
            names = imported(node, package)
            if names and names[0].split(".")[0] == "kafkatunnel":
                base, *members = names
                # a module, or a folder's modules, or names of a module (members that are
                # not modules are then its attributes)
                ok = base in shipped or (base in folders and set(members) <= set(shipped))
            else:
                ok = all(n.split(".")[0] in sys.stdlib_module_names | importable for n in names)
            if not ok:
                wrong.append(f"{path}:{getattr(node, 'lineno', 0)}: {', '.join(names)}")
    assert wrong == [], "imports of what the wheel neither holds nor requires:\n" + "\n".join(wrong)
