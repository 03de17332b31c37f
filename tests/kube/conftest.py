"""The kubectl stand-in first on PATH, over a world whose pods are the cluster's brokers."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.localcluster import LocalCluster

STANDIN = Path(__file__).parent / "bin"
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
    monkeypatch.setenv("PATH", f"{STANDIN}:{__import__('os').environ['PATH']}")
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
