"""The Prometheus metrics a running tunnel serves: traffic per broker, requests per API,
rewritten answers, forward restarts, and coordinator errors seen (NOT_COORDINATOR)."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from pytest import MonkeyPatch

from kafkatunnel.demo import LocalCluster, free_port
from kafkatunnel.demo.workload import consume_group, produce
from kafkatunnel.probe import ProbeConnection, find_coordinator
from tests.tunnel.conftest import MakeTunnel

SAMPLE = re.compile(r"^(?P<name>\w+)\{(?P<labels>[^}]*)\} (?P<value>\d+)$")


def _parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], int]:
    samples = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            samples[(match["name"], labels)] = int(match["value"])
    return samples


def _total(samples: dict[tuple[str, frozenset[tuple[str, str]]], int], name: str,
           **labels: str) -> int:  # fmt: skip
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def test_metrics_count_apis_rewrites_and_not_coordinator(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    tunnel = make_tunnel()
    topic = f"metrics-{uuid.uuid4().hex[:6]}"
    assert produce(tunnel.bootstrap_servers, topic, 10) == 10
    group = f"{topic}-g"
    assert consume_group(tunnel.bootstrap_servers, group, topic, 10).ok
    coordinator = find_coordinator(tunnel.bootstrap_servers, group)
    other = next(e for e in tunnel.status()["endpoints"][1:] if e["node_id"] != coordinator.node_id)
    with ProbeConnection(other["tunnel"]) as probe:  # a JoinGroup to the wrong broker
        assert probe.join_group_error(group)[0] == 16

    samples = _parse(tunnel.metrics())
    assert _total(samples, "kafkatunnel_api_requests_total", api="Produce") >= 1
    assert _total(samples, "kafkatunnel_api_requests_total", api="Fetch") >= 1
    assert _total(samples, "kafkatunnel_api_requests_total", api="JoinGroup",
                  node=str(coordinator.node_id)) >= 1  # fmt: skip
    assert _total(samples, "kafkatunnel_rewrites_total", node="bootstrap") >= 1
    assert _total(samples, "kafkatunnel_coordinator_errors_total", error="NOT_COORDINATOR",
                  node=str(other["node_id"])) == 1  # fmt: skip
    assert _total(samples, "kafkatunnel_coordinator_errors_total", error="NOT_COORDINATOR") == 1
    assert _total(samples, "kafkatunnel_forward_restarts_total") == 0
    assert _total(samples, "kafkatunnel_connections_total") >= 4


def test_metrics_over_tcp_only_when_asked(
    cluster: LocalCluster, make_tunnel: MakeTunnel, tmp_path: Path, monkeypatch: MonkeyPatch
) -> None:
    """By default nothing but the owner's control socket serves status and metrics; with
    metrics_listen (--metrics-listen) Prometheus scrapes /metrics over TCP, and only that:
    /status (brokers, errors, recording paths) stays on the socket."""
    monkeypatch.setenv("KAFKATUNNEL_STATE_DIR", str(tmp_path))
    quiet = make_tunnel(control=True)
    assert quiet.status()["metrics"] is None
    assert quiet.status()["control"].startswith("unix:")
    port = free_port()
    scraped = make_tunnel(control=True, metrics_listen=("127.0.0.1", port))
    assert scraped.status()["metrics"] == f"127.0.0.1:{port}"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        assert b"kafkatunnel_connections_total" in answer.read()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5)
    assert refused.value.code == 404
