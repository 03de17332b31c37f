"""doctor's checks of names, brokers and groups, each failing and passing, through real
tunnels into the isolated cluster (the kubectl checks are in tests/kube)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kafkatunnel.demo import LocalCluster, free_port
from kafkatunnel.demo.single_forward import SingleForward
from kafkatunnel.demo.workload import consume_groups, produce
from kafkatunnel.doctor import (
    FAIL,
    PASS,
    SKIP,
    Subject,
    check_brokers,
    check_names,
    dns_server_resolve,
    smoke_group,
    subject_from_status,
    system_resolve,
)
from kafkatunnel.hostnames import split_address
from kafkatunnel.tunnel import ExecForwarder
from tests.tunnel.conftest import MakeTunnel
from tests.worlds.sessions import spread_workload


def test_broker_names_resolve_only_through_the_dns_shim(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    assert cluster.tansu is not None  # it advertises kafka-0.kafka-headless.demo.svc...
    tunnel = make_tunnel(cluster.tansu.address, dns_listen=("127.0.0.1", free_port()))
    status = tunnel.status()
    subject = subject_from_status(status, None)
    assert list(subject.names) == [cluster.tansu.host]
    shim = dns_server_resolve(status["dns"]["listen"])
    assert [r.status for r in check_names(subject, shim)] == [PASS]
    (failed,) = check_names(subject, system_resolve)  # this machine's resolver knows nothing
    assert failed.status == FAIL and "kafkatunnel dns setup" in failed.fix


def test_without_the_dns_shim_names_are_not_checked(make_tunnel: MakeTunnel) -> None:
    subject = subject_from_status(make_tunnel().status(), None)
    assert [r.status for r in check_names(subject, system_resolve)] == [SKIP]


def test_every_broker_answers_through_the_tunnel(make_tunnel: MakeTunnel) -> None:
    results, reachable = check_brokers(make_tunnel().bootstrap_servers)
    assert [r.status for r in results] == [PASS] * 4 and reachable == [1, 2, 3]


def test_a_broker_whose_forward_fails_is_named(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    broken = cluster.mock[1]
    tunnel = make_tunnel()
    inner = cluster.exec_template().replace("{host}", "$0").replace("{port}", "$1")
    forwarder = tunnel.tunnel.forwarder
    assert isinstance(forwarder, ExecForwarder)
    forwarder.template = (
        f"sh -c '[ \"$1\" = {broken.port} ] && exit 1; exec {inner}' {{host}} {{port}}"
    )
    results, reachable = check_brokers(tunnel.bootstrap_servers)
    failed = [r for r in results if r.status == FAIL]
    assert [r.check for r in failed] == [f"broker {broken.node_id} reachable"]
    assert "forward to broker" in failed[0].fix
    assert broken.node_id not in reachable
    down, _ = check_brokers("127.0.0.1:1")
    assert down[0].status == FAIL and "kafkatunnel up" in down[0].fix


def test_a_tunnel_on_ipv6_loopback_names_itself_as_it_reads_back(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    """Every address the tunnel writes (status, the DNS shim's, what doctor probes) reads
    back as --listen does: with the IPv6 host in brackets, never `::1:9092`."""
    assert cluster.tansu is not None  # a name for the shim to serve
    tunnel = make_tunnel(cluster.tansu.address, listen_host="::1", dns_listen=("::1", free_port()))
    status = tunnel.status()
    assert tunnel.bootstrap_servers == f"[::1]:{tunnel.tunnel.config.listen_port}"
    for endpoint in status["endpoints"]:
        assert split_address(endpoint["tunnel"])[0] == "::1", endpoint
    shim = dns_server_resolve(status["dns"]["listen"])
    assert [r.status for r in check_names(subject_from_status(status, None), shim)] == [PASS]
    results, reachable = check_brokers(tunnel.bootstrap_servers)
    assert [r.status for r in results] == [PASS] * 2 and len(reachable) == 1


def test_a_group_on_each_broker_joins_through_the_tunnel_not_through_one_forward(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    tunnel = make_tunnel()
    with ThreadPoolExecutor(3) as pool:  # each join waits 3 s on the mock: all at once
        assert list(pool.map(lambda n: smoke_group(tunnel.bootstrap_servers, n).status,
                             (1, 2, 3))) == [PASS] * 3  # fmt: skip
        leader = cluster.mock[0]
        with SingleForward(cluster, leader):
            results = dict(zip((1, 2, 3), pool.map(lambda n: smoke_group(leader.address, n),
                                                   (1, 2, 3)), strict=True))  # fmt: skip
    assert results[leader.node_id].status == PASS
    for node, result in results.items():
        if node != leader.node_id:
            assert result.status == FAIL and "NOT_COORDINATOR" in result.detail
            assert "single port-forward" in result.fix


def test_the_command_exits_by_its_checks(make_tunnel: MakeTunnel, tmp_path: Path) -> None:
    tunnel = make_tunnel()
    ok = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "doctor", "--bootstrap", tunnel.bootstrap_servers,
         "--json"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    report = json.loads(ok.stdout)
    assert report["ok"] and len([c for c in report["checks"] if c["status"] == PASS]) >= 7
    nothing = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "doctor", "--bootstrap", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert nothing.returncode == 1 and "some checks failed" in nothing.stdout
    assert Subject().bootstrap is None


def test_a_recording_with_a_doctor_run_in_it_passes_verify_strict(
    cluster: LocalCluster, make_tunnel: MakeTunnel, tmp_path: Path
) -> None:
    work = spread_workload(cluster, f"doc-{uuid.uuid4().hex[:6]}", per_broker=1)
    tunnel = make_tunnel(record_dir=tmp_path / "rec")
    produce(tunnel.bootstrap_servers, work.topic, 6)
    doctor = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "doctor", "--bootstrap", tunnel.bootstrap_servers],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    consumed = consume_groups(tunnel.bootstrap_servers, dict.fromkeys(work.groups, 6), work.topic)
    assert all(r.ok for r in consumed.values())
    tunnel.stop()
    out = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--in-process", "--strict", "--json",
         "-", str(tmp_path / "rec")], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    verdicts = json.loads(out.stdout)["groups"]
    applications = {v["key"]: v["verdict"] for v in verdicts if v["tool"] is None}
    assert applications == dict.fromkeys(work.groups, "ok")
    doctors = [v for v in verdicts if v["tool"] == "kafkatunnel-doctor"]
    # joined: ok; only looked up on the way to a group of the right broker: unverified (when
    # each broker's first guess is right, 1 run in 27 on three brokers, there are none)
    assert {v["verdict"] for v in doctors} - {"unverified"} == {"ok"}
    assert sum(v["verdict"] == "ok" for v in doctors) == 3  # a smoke group per broker
