"""The real resolver path, no mocks: a second network namespace plays the laptop. Its
resolv.conf points at the shim on port 53; the tunnel runs there in transparent mode; clients
use the brokers' in-cluster names, plaintext and TLS with hostname verification."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafkatunnel.demo import TANSU_HOST, LocalCluster
from kafkatunnel.demo.harness import tansu_binary
from kafkatunnel.demo.netns import NetworkNamespace
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import wait_for

RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:2\n"


@pytest.fixture
def laptop(cluster: LocalCluster) -> Iterator[NetworkNamespace]:
    with NetworkNamespace(resolv_conf=RESOLV_CONF) as namespace:
        yield namespace


def _tunnel_in(
    laptop: NetworkNamespace, cluster: LocalCluster, tmp: Path, *args: str
) -> ManagedProcess:
    up = [
        sys.executable, "-m", "kafkatunnel", "up", "--via", "exec",
        "--exec", cluster.exec_template(), "--mode", "transparent", "--dns",
        "--dns-listen", "127.0.0.1:53", "--dns-setup", "none", "--no-table", *args,
    ]  # fmt: skip
    process = ManagedProcess(
        [*laptop.exec_prefix(), *up], name="laptop-tunnel", env={"KAFKATUNNEL_STATE_DIR": str(tmp)}
    )
    process.wait_for_line(r"^bootstrap\.servers=", timeout=30)
    return process


def _run_in(
    laptop: NetworkNamespace, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*laptop.exec_prefix(), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _in_laptop(laptop: NetworkNamespace, *argv: str, env: dict[str, str] | None = None) -> str:
    result = _run_in(laptop, *argv, env=env)
    assert result.returncode == 0, (argv, result.stdout, result.stderr[-2000:])
    return result.stdout


def _workload(laptop: NetworkNamespace, *args: str, env: dict[str, str] | None = None) -> str:
    return _in_laptop(
        laptop, sys.executable, "-m", "kafkatunnel.demo.workload", *args, env=env
    ).strip()


def test_names_resolve_and_clients_use_them(
    cluster: LocalCluster, laptop: NetworkNamespace, tmp_path: Path
) -> None:
    assert cluster.tansu is not None
    tunnel = _tunnel_in(laptop, cluster, tmp_path, "--bootstrap", cluster.tansu.address)
    try:
        # transparent mode: clients must use a broker's name, so that is what is printed
        shown = tunnel.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=1).group(1)
        assert shown == cluster.tansu.address
        tunnel.wait_for_line(r"^broker \d+: 127\.0\.0\.2:9092 ", timeout=10)
        for name in (TANSU_HOST, "KAFKA-0.kafka-headless.demo.svc"):
            assert _in_laptop(laptop, "getent", "hosts", name).split()[0] == "127.0.0.2"
        unknown = "kafka-9.kafka-headless.demo.svc.cluster.local"
        assert _run_in(laptop, "getent", "hosts", unknown).returncode == 2  # not found
        # a short form is outside the zones: the shim is not its server (--dns-zone makes it)
        assert _run_in(laptop, "getent", "hosts", "kafka-0.kafka-headless").returncode == 2

        topic = f"laptop-{uuid.uuid4().hex[:6]}"
        bootstrap = f"{TANSU_HOST}:9092"
        assert _workload(laptop, "produce", bootstrap, topic, "25") == "PRODUCED 25"
        consumed = _workload(laptop, "consume", bootstrap, f"{topic}-g", topic, "25")
        assert consumed == "CONSUMED 25 NOT_COORDINATOR 0"
    finally:
        tunnel.stop()


def _certificates(directory: Path, name: str) -> dict[str, Path]:
    """A test CA and a certificate for `name`, signed by it."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=kafkatunnel test CA",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
        "-subj", f"/CN={name}",
    )  # fmt: skip
    (directory / "ext.cnf").write_text(f"subjectAltName=DNS:{name}\n")
    openssl(
        "x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "broker.pem", "-days", "2", "-extfile", "ext.cnf",
    )  # fmt: skip
    return {name: directory / name for name in ("ca.pem", "broker.pem", "broker.key")}


def _cluster_port_open(cluster: LocalCluster, port: int) -> None:
    def accepting() -> bool:
        cluster.connect("127.0.0.1", port).close()
        return True

    wait_for(accepting, timeout=20, what=f"port {port} in the cluster")


def test_tls_with_hostname_verification_in_transparent_mode(
    cluster: LocalCluster, laptop: NetworkNamespace, tmp_path: Path
) -> None:
    """The broker's TLS endpoint is OpenSSL (socat) in front of a tansu broker, inside the
    cluster, serving a certificate for the broker's own name on its advertised port."""
    certs = _certificates(tmp_path / "ca", TANSU_HOST)
    broker = [
        tansu_binary(), "broker", "--listener-url", "tcp://127.0.0.1:19092",
        "--advertised-listener-url", f"tcp://{TANSU_HOST}:9093", "--storage-engine", "memory://tls/",
    ]  # fmt: skip
    tls_endpoint = [
        "socat",
        f"OPENSSL-LISTEN:9093,reuseaddr,fork,cert={certs['broker.pem']},"
        f"key={certs['broker.key']},verify=0",
        "TCP:127.0.0.1:19092",
    ]
    processes = [
        ManagedProcess(cluster.inside(broker), name="tansu-behind-tls"),
        ManagedProcess(cluster.inside(tls_endpoint), name="tls-endpoint"),
    ]
    tunnel = None
    try:
        for port in (19092, 9093):
            _cluster_port_open(cluster, port)
        bootstrap = f"{TANSU_HOST}:9093"
        tunnel = _tunnel_in(
            laptop, cluster, tmp_path, "--bootstrap", bootstrap, "--broker", bootstrap
        )
        tunnel.wait_for_line(r"127\.0\.0\.2:9093", timeout=10)
        tls = {
            "security.protocol": "SSL",
            "ssl.ca.location": str(certs["ca.pem"]),
            "ssl.endpoint.identification.algorithm": "https",
        }
        env = {"KAFKATUNNEL_CLIENT_CONFIG": json.dumps(tls)}
        topic = f"tls-{uuid.uuid4().hex[:6]}"
        assert _workload(laptop, "produce", bootstrap, topic, "15", env=env) == "PRODUCED 15"
        consumed = _workload(laptop, "consume", bootstrap, f"{topic}-g", topic, "15", env=env)
        assert consumed == "CONSUMED 15 NOT_COORDINATOR 0"

        other_ca = _certificates(tmp_path / "other-ca", TANSU_HOST)["ca.pem"]
        untrusted = {
            # the refused produce gives up after 3 s, not after the flush's 30
            "KAFKATUNNEL_CLIENT_CONFIG": json.dumps(
                {**tls, "ssl.ca.location": str(other_ca), "message.timeout.ms": 3000}
            )
        }
        refused = _run_in(
            laptop, sys.executable, "-m", "kafkatunnel.demo.workload", "produce",
            bootstrap, topic, "1", env=untrusted,
        )  # fmt: skip
        assert "PRODUCED 0" in refused.stdout  # verification is really on: a wrong CA fails
    finally:
        if tunnel is not None:
            tunnel.stop()
        for process in processes:
            process.stop()


def test_up_with_dns_sets_up_the_resolver_and_undoes_it_on_exit(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """`up --dns --dns-setup hosts` inside a namespace whose /etc/hosts is its own file:
    the names are added while the tunnel runs and the file is byte-identical after SIGTERM."""
    import signal

    assert cluster.tansu is not None
    with NetworkNamespace(hosts={"laptop.local": "127.0.1.1"}) as laptop:
        hosts_file = Path("/etc/netns") / laptop.name / "hosts"
        before = hosts_file.read_bytes()
        up = [
            sys.executable, "-m", "kafkatunnel", "up", "--bootstrap", cluster.tansu.address,
            "--exec", cluster.exec_template(), "--dns", "--dns-listen", "127.0.0.1:53",
            "--dns-setup", "hosts", "--no-table",
        ]  # fmt: skip
        tunnel = ManagedProcess(
            [*laptop.exec_prefix(), *up],
            name="laptop-tunnel",
            env={"KAFKATUNNEL_STATE_DIR": str(tmp_path)},
        )
        try:
            # rewrite mode: clients use the tunnel's address; each name's own is shown too
            tunnel.wait_for_line(r"^bootstrap\.servers=127\.0\.0\.1:9092$", timeout=30)
            tunnel.wait_for_line(r"^resolver: hosts: ", timeout=30)
            tunnel.wait_for_line(r"^broker \d+: 127\.0\.0\.1:9093 -> kafka-0\..* \(name: "
                                 r"127\.0\.0\.2:9092\)$", timeout=10)  # fmt: skip
            during = hosts_file.read_text()
            assert f"127.0.0.2 {'kafka-0.kafka-headless'}" in during
            assert TANSU_HOST in during
            os.kill(tunnel.pid, signal.SIGTERM)
            assert tunnel.popen.wait(timeout=15) == 0
            tunnel.wait_for_line(r"^resolver: remove the managed block", timeout=5)
        finally:
            tunnel.stop()
        assert hosts_file.read_bytes() == before
