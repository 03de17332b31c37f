"""The kubectl stand-in first on PATH, over a world whose pods are the cluster's brokers; and
the real kubectl binaries of this machine over an API server that serves the same world."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.demo import LocalCluster, free_port
from kafkatunnel.demo.processes import ManagedProcess
from tests.worlds.kubernetes import HOME_VARIABLE, VERSION

STANDIN = Path(__file__).parent / "bin"
APISERVER = Path(__file__).with_name("apiserver.py")
DEBIAN_KUBECTL = Path(sys.executable).parent.parent / "opt/kubernetes-client/usr/bin/kubectl"
LABELS = {"app.kubernetes.io/name": "kafka", "app.kubernetes.io/instance": "demo"}

World = Callable[..., Path]


@pytest.fixture
def world(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[World]:
    """Write a world (namespace "kafka": a pod kafka-i per mock broker, all on one pod IP as
    brokers that advertise 127.0.0.1 look) and put the stand-in first on PATH."""
    path = tmp_path / "world.json"
    monkeypatch.setenv("KUBECTL_STANDIN_WORLD", str(path))
    monkeypatch.setenv("PATH", f"{STANDIN}:{os.environ['PATH']}")
    assert cluster.namespace is not None

    def write(**changes: Any) -> Path:
        pods = [
            {"name": f"kafka-{i}", "ip": "127.0.0.1", "ports": [b.port], "labels": LABELS}
            for i, b in enumerate(cluster.mock)
        ]
        world: dict[str, Any] = {
            "current_context": "kind-demo",
            "namespace": "default",
            "netns": cluster.namespace.name,  # type: ignore[union-attr]
            "namespaces": {
                "default": {"pods": []},
                "kafka": {
                    "pods": pods,
                    "statefulsets": {"kafka": {"selector": LABELS}},
                    "services": {"kafka-headless": {"selector": LABELS}},
                },
            },
        }
        world.update(changes)
        path.write_text(json.dumps(world))
        return path

    write()
    yield write


def version_of(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def real_kubectls() -> dict[str, str]:
    """version ("1.32") -> binary, for each real kubectl here: the one on PATH (without the
    stand-in), its versioned siblings (the Cloud SDK's kubectl dispatches to them),
    Debian's kubernetes-client (1.20) that scripts/test unpacks beside the virtualenv, and
    the kubectl scripts/test builds with the real cluster (its release: on every machine,
    one that speaks websockets)."""
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != str(STANDIN))
    built = Path(os.environ.get(HOME_VARIABLE) or Path.home() / ".cache/kafkatunnel"
                 / f"kubernetes-{VERSION}") / "bin/kubectl"  # fmt: skip
    candidates = [str(DEBIAN_KUBECTL), str(built)]
    found = shutil.which("kubectl", path=path)
    if found is not None:
        siblings = Path(found).resolve().parent.glob("kubectl.1.*")
        candidates += [found, *sorted(str(p) for p in siblings)]
    versions: dict[str, str] = {}
    for binary in candidates:
        try:
            out = subprocess.run([binary, "version", "--client", "-o", "json"],
                                 capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            continue
        match = re.search(r'"gitVersion": "v(\d+\.\d+)', out)
        if match and match[1] not in versions:
            versions[match[1]] = binary
    return dict(sorted(versions.items(), key=lambda kv: version_of(kv[0])))


KUBECTLS = real_kubectls()
needs_kubectl = pytest.mark.skipif(not KUBECTLS, reason="no real kubectl on this machine")
NEWEST = list(KUBECTLS)[-1] if KUBECTLS else ""
OLDEST = next(iter(KUBECTLS)) if KUBECTLS else ""
# kubectl port-forward speaks websockets by default from 1.31 (KEP-4006), SPDY before: the
# newest kubectl here from before that
BEFORE_WEBSOCKETS = max((v for v in KUBECTLS if version_of(v) < (1, 31)), key=version_of,
                        default="")  # fmt: skip


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return apiserver_certificate(tmp_path_factory.mktemp("apiserver-tls"))


def apiserver_certificate(where: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1: the API server speaks HTTPS, as clusters do
    (kubectl runs a user's exec credential plugin only for HTTPS)."""
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    return cert, key


@pytest.fixture
def apiserver(
    world: World,
    certificate: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Path]:
    """The world served by tests/kube/apiserver.py, a kubeconfig for it, and the newest
    real kubectl on PATH in front of the stand-in; yields the world's path."""
    path = world()
    port = free_port()
    cert, key = certificate
    server = ManagedProcess([sys.executable, str(APISERVER), str(path), str(port), str(cert),
                             str(key)], name="apiserver")  # fmt: skip
    server.wait_for_line(r"^serving on ", timeout=30)
    config = tmp_path / "kubeconfig"
    config.write_text(kubeconfig(port, cert))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(KUBECTLS[NEWEST])
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "kube-cache"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    try:
        yield path
    finally:
        server.stop()


def kubeconfig(port: int, ca: Path) -> str:
    """A kubeconfig for the API server, context kind-demo, a token it does not check."""
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: kind-demo\n"
        f"clusters:\n- name: demo\n  cluster:\n    server: https://127.0.0.1:{port}\n"
        f"    certificate-authority: {ca}\n"
        "contexts:\n- name: kind-demo\n  context:\n    cluster: demo\n    user: developer\n"
        "users:\n- name: developer\n  user:\n    token: not-checked\n"
    )


@pytest.fixture(params=["stand-in", "real"])
def kubectl(request: pytest.FixtureRequest, world: World) -> str:
    """For tests that run with each: the stand-in over the world, or the real kubectl over
    the API server that serves the same world (skipped where no real kubectl is)."""
    if request.param == "real":
        if not KUBECTLS:
            pytest.skip("no real kubectl on this machine")
        request.getfixturevalue("apiserver")
    return str(request.param)


@pytest.fixture
def one_kubectl(request: pytest.FixtureRequest, world: World) -> str:
    """For the longest runs under faults: the real kubectl over the API server where there is
    one, else the stand-in. Running both doubles a minute of the suite; the stand-in's copy of
    each fault is held to the real one's behaviour by the tests that take `kubectl`."""
    if KUBECTLS:
        request.getfixturevalue("apiserver")
        return "real"
    return "stand-in"


def up(*args: str) -> subprocess.CompletedProcess[str]:
    """`kafkatunnel up --via kubectl ARGS` to its end (the cases that fail before serving)."""
    return subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "up", "--via", "kubectl", "--no-table", *args],
        capture_output=True, text=True, timeout=60, env=dict(os.environ),
    )  # fmt: skip


def says(result: subprocess.CompletedProcess[str], *phrases: str) -> None:
    """`up` failed as a user's mistake (exit 2), saying each phrase."""
    text = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, text
    for phrase in phrases:
        assert phrase in text, (phrase, text)
