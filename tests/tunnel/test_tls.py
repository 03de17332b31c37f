"""TLS clusters in rewrite mode: the tunnel is each broker's TLS client, verifying the
broker's advertised name through a forward that dials another address, and clients keep
plaintext. Real TLS: socat's OpenSSL listeners in front of the mock cluster's brokers,
certificates from a CA the test makes."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
import ssl
import subprocess
import sys
import uuid
from pathlib import Path

import confluent_kafka
import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.harness import start_tansu
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.demo.workload import (
    consume_group,
    consume_groups,
    produce,
    produce_transaction,
)
from kafkatunnel.hostnames import split_address
from kafkatunnel.tunnel import DirectForwarder, ExecForwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel
from kafkatunnel.tunnel.reachability import Unreachable
from kafkatunnel.tunnel.tls import (
    TlsForwarder,
    TlsOptions,
    TlsSetupError,
    client_context,
    listener_tls,
    pkcs12_pem,
)
from kafkatunnel.verify.job import verify_local
from kafkatunnel.verify.judge import OK
from kafkatunnel.waiting import wait_for
from tests.kio_messages import request_frame
from tests.pki import TestAuthority
from tests.tunnel.test_stalled_client import stalled_client_gets_every_answer
from tests.tunnel.tls_front import SocketForwarder, TlsFront

ADVERTISED = "127.0.0.1"  # what the mock brokers advertise: the name TLS checks


@pytest.fixture
def ca(tmp_path: Path) -> TestAuthority:
    return TestAuthority(tmp_path)


def _tunnel(
    cluster: LocalCluster,
    front: TlsFront,
    tls: TlsOptions,
    bootstrap: str | None = None,
    template: str | None = None,
    record_dir: Path | None = None,
    via: str = "exec",
) -> BackgroundTunnel:
    config = TunnelConfig(
        bootstrap=bootstrap or cluster.mock[0].address,
        listen_port=free_port_run(8),
        control=False,
        start_timeout=10,
        tls=client_context(tls),
        tls_certificate=tls.certificate_named,
        record_dir=record_dir,
    )
    if via == "socket":
        return BackgroundTunnel(config, SocketForwarder(cluster))
    return BackgroundTunnel(config, ExecForwarder(template or front.exec_template()))


# The two ways TLS runs: OpenSSL on the forward's socket, or memory BIOs on an exec's pipes.
VIAS = pytest.mark.parametrize("via", ["socket", "exec"])


@VIAS
def test_plaintext_clients_use_groups_on_every_coordinator_and_transactions_over_tls(
    cluster: LocalCluster, ca: TestAuthority, tmp_path: Path, via: str
) -> None:
    """...and the recording holds the Kafka frames inside TLS: verify judges every group."""
    server_expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=20)
    server = ca.issue("brokers", [ADVERTISED], not_after=server_expiry)
    recordings = tmp_path / "recorded"
    front = TlsFront(cluster, server)
    tunnel = _tunnel(cluster, front, TlsOptions(ca.pem), record_dir=recordings, via=via)
    with front, tunnel:
        bootstrap = tunnel.bootstrap_servers
        topic = f"tls-{uuid.uuid4().hex[:8]}"
        assert produce(bootstrap, topic, 30, prefix="p") == 30
        produce_transaction(bootstrap, topic, f"{topic}-tx", 10)
        spread = cluster.groups_by_coordinator(1, prefix=f"{topic}-g")
        assert len(spread) == 3
        groups = {g: 40 for node_groups in spread.values() for g in node_groups}
        results = consume_groups(bootstrap, groups, topic, timeout=60)
        for group, result in results.items():
            assert result.coordinator_errors == [], (group, result.coordinator_errors[:3])
            assert result.consumed == 40, (group, result.errors[:3])
        status = tunnel.status()
        sessions = [e["tls"] for e in status["endpoints"]]
        assert len(sessions) == 4
        for session in sessions:
            assert session["version"] in ("TLSv1.2", "TLSv1.3"), session
            assert session["subject"] == "CN=127.0.0.1" and session["names"] == ["IP:127.0.0.1"]
            assert session["expires"].startswith(str(server_expiry.date())), session
        assert all(", TLSv1." in e["route"] for e in status["endpoints"])
    report = verify_local([str(recordings)])
    judged = {v.key: v for v in report.verdicts if v.key in groups}
    assert report.ok and set(judged) == set(groups), report.problems
    assert all(v.verdict == OK for v in judged.values())


def _expired() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("another name", ["does not name 127.0.0.1", "names DNS:kafka-9.elsewhere.example"]),
        ("unknown CA", ["unable to get local issuer certificate", "trust the CA", "--tls-ca"]),
        ("expired", ["certificate has expired", "renew it", "valid until"]),
    ],
)
def test_an_untrusted_broker_stops_up_with_what_its_certificate_says(
    cluster: LocalCluster, ca: TestAuthority, tmp_path: Path, case: str, expected: list[str]
) -> None:
    """Through the real `up`: exit 2, one message naming the broker, the name checked, the
    certificate's subject, names, issuer and expiry, and the fix; no traceback."""
    if case == "another name":
        server = ca.issue("brokers", ["kafka-9.elsewhere.example"])
    elif case == "unknown CA":
        server = TestAuthority(tmp_path / "..", name=f"someone else {uuid.uuid4().hex[:6]}").issue(
            "brokers", [ADVERTISED]
        )
    else:
        server = ca.issue("brokers", [ADVERTISED], not_after=_expired())
    with TlsFront(cluster, server) as front:
        result = subprocess.run(
            [
                sys.executable, "-m", "kafkatunnel", "up", "--no-table",
                "--bootstrap", cluster.mock[0].address,
                "--via", "exec", "--exec", front.exec_template(),
                "--listen", f"127.0.0.1:{free_port_run(8)}",
                "--tls", "--tls-ca", str(ca.pem), "--start-timeout", "10",
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert f"the certificate of {cluster.mock[0].address} was refused" in message, message
    assert f"name checked: {ADVERTISED}" in message, message
    assert "issuer CN=" in message, message
    for words in expected:
        assert words in message, (words, message)
    assert "bootstrap.servers=" not in result.stdout


@pytest.mark.parametrize(("form", "via"), [("pem", "socket"), ("pkcs12", "exec")])
def test_mutual_tls_works_with_the_client_certificate_and_says_why_without(
    cluster: LocalCluster, ca: TestAuthority, form: str, via: str
) -> None:
    server = ca.issue("brokers", [ADVERTISED])
    client = ca.issue("developer", ["developer"], client=True, password=b"p12-s3cret")
    if form == "pem":
        mine = TlsOptions(ca.pem, client.cert, client.key, password=b"p12-s3cret")
    else:
        cert_pem, key_pem = pkcs12_pem(client.p12, b"p12-s3cret")
        mine = TlsOptions(ca.pem, cert_pem=cert_pem, key_pem=key_pem)
        with pytest.raises(TlsSetupError, match="the password is wrong"):
            pkcs12_pem(client.p12, b"wrong")
    with TlsFront(cluster, server, client_ca=ca.pem) as front:
        with _tunnel(cluster, front, mine, via=via) as tunnel:
            topic = f"mtls-{uuid.uuid4().hex[:8]}"
            assert produce(tunnel.bootstrap_servers, topic, 5) == 5

        with pytest.raises(Unreachable) as refused:
            _tunnel(cluster, front, TlsOptions(ca.pem), via=via).start()
    assert refused.value.refused  # for good: no waiting out the start timeout
    message = str(refused.value)
    assert "(tlsv13 alert certificate required); fix: the listener requires a client " \
        "certificate (mTLS) and the tunnel presented none: give --tls-cert FILE with " \
        "--tls-key FILE, or --tls-pkcs12 FILE, or with --via kubectl --kafka-user NAME" \
        in message, message  # fmt: skip


@pytest.mark.parametrize("form", ["pem", "pkcs12"])
def test_a_refused_client_certificate_is_named_as_the_user_gave_it(
    cluster: LocalCluster, ca: TestAuthority, tmp_path: Path, form: str
) -> None:
    """A client certificate from a CA the listener does not trust: up names it by the flag
    that gave it, --tls-cert or --tls-pkcs12, not always --tls-cert."""
    server = ca.issue("brokers", [ADVERTISED])
    (tmp_path / "elsewhere").mkdir()
    stranger = TestAuthority(tmp_path / "elsewhere", "another CA")
    client = stranger.issue("developer", ["developer"], client=True, password=b"p12-s3cret")
    given = (["--tls-cert", str(client.cert), "--tls-key", str(client.key)] if form == "pem"
             else ["--tls-pkcs12", str(client.p12)])  # fmt: skip
    named = f"--tls-cert {client.cert}" if form == "pem" else f"--tls-pkcs12 {client.p12}"
    with TlsFront(cluster, server, client_ca=ca.pem) as front:
        result = subprocess.run(
            [sys.executable, "-m", "kafkatunnel", "up", "--no-table",
             "--bootstrap", cluster.mock[0].address, "--exec", front.exec_template(),
             "--listen", f"127.0.0.1:{free_port_run(8)}", "--start-timeout", "10",
             "--tls", "--tls-ca", str(ca.pem), *given],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "KAFKATUNNEL_TLS_PASSWORD": "p12-s3cret"},
        )  # fmt: skip
    message = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in message, message
    assert f"(tlsv1 alert unknown ca); fix: the broker does not trust the CA of {named}: " \
        in message, message  # fmt: skip


def test_up_without_tls_says_the_listener_speaks_tls(
    cluster: LocalCluster, ca: TestAuthority
) -> None:
    server = ca.issue("brokers", [ADVERTISED])
    with TlsFront(cluster, server) as front:
        result = subprocess.run(
            [
                sys.executable, "-m", "kafkatunnel", "up", "--no-table",
                "--bootstrap", cluster.mock[0].address,
                "--via", "exec", "--exec", front.exec_template(),
                "--listen", f"127.0.0.1:{free_port_run(8)}", "--start-timeout", "10",
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert "this listener speaks TLS: add --tls (and --tls-ca FILE)" in message, message


def test_a_kubernetes_style_name_is_verified_through_a_forward_to_another_address(
    cluster: LocalCluster, ca: TestAuthority
) -> None:
    """tansu advertises kafka-0.kafka-headless.demo.svc.cluster.local; its TLS listener
    holds a certificate for that name only, and is dialled at 127.0.0.2."""
    assert cluster.tansu is not None
    server = ca.issue("tansu", [cluster.tansu.host])
    # tansu listens on every address of the cluster's network: its TLS listener is 1PORT
    routes = {int(f"1{cluster.tansu.port}"): f"127.0.0.1:{cluster.tansu.port}"}
    with TlsFront(cluster, server, routes=routes) as front:
        template = front.exec_template(port_prefix="1")
        tunnel = _tunnel(cluster, front, TlsOptions(ca.pem), cluster.tansu.address, template)
        with tunnel:
            topic = f"tls-name-{uuid.uuid4().hex[:8]}"
            assert produce(tunnel.bootstrap_servers, topic, 20) == 20
            result = consume_group(tunnel.bootstrap_servers, f"{topic}-g", topic, 20, timeout=60)
            assert result.consumed == 20, result.errors[:3]
            sessions = {e["advertised"]: e["tls"] for e in tunnel.status()["endpoints"]}
        assert sessions[cluster.tansu.address]["names"] == [f"DNS:{cluster.tansu.host}"]


def test_sni_names_the_advertised_broker_not_the_forwarded_address(tmp_path: Path) -> None:
    """OpenSSL's s_server (OpenSSL 3.0) shows the certificate for the broker's name only to
    a handshake whose SNI is that name (any other gets one for wrong.example, which fails
    verification); the tunnel dials 127.0.0.1 and still sends the name."""
    ca = TestAuthority(tmp_path)
    name = "kafka-1.kafka-headless.shop.svc.cluster.local"
    right, wrong = ca.issue("right", [name]), ca.issue("wrong", ["wrong.example"])
    port = free_port_run(1)
    server = subprocess.Popen(
        [
            "openssl", "s_server", "-accept", f"127.0.0.1:{port}", "-quiet",
            "-cert", str(wrong.cert), "-key", str(wrong.key),
            "-servername", name, "-cert2", str(right.cert), "-key2", str(right.key),
            "-servername_fatal",
        ],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    forwarder = TlsForwarder(
        DirectForwarder({(name, 9093): ("127.0.0.1", port)}),
        client_context(TlsOptions(ca.pem)),
    )

    async def handshake(host: str) -> dict[str, object] | None:
        upstream = await forwarder.open(host, 9093)
        await upstream.discard()
        return forwarder.session(host, 9093)

    try:
        wait_for(lambda: _accepting(port), timeout=10, what="openssl s_server")
        session = asyncio.run(handshake(name))
        assert session is not None and session["names"] == [f"DNS:{name}"]
    finally:
        server.kill()
        server.wait()


def _accepting(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def test_an_encrypted_key_needs_its_password_from_a_file_or_variable(tmp_path: Path) -> None:
    ca = TestAuthority(tmp_path)
    client = ca.issue("developer", ["developer"], client=True, password=b"s3cret")
    with pytest.raises(TlsSetupError, match="--tls-password-file, or in KAFKATUNNEL_TLS_PASSWORD"):
        client_context(TlsOptions(ca.pem, client.cert, client.key))
    with pytest.raises(TlsSetupError, match="a wrong password reads as a bad key"):
        client_context(TlsOptions(ca.pem, client.cert, client.key, password=b"wrong"))
    assert client_context(TlsOptions(ca.pem, client.cert, client.key, password=b"s3cret"))


def test_tls_insecure_says_what_it_turns_off_and_turns_it_off(tmp_path: Path) -> None:
    insecure = TlsOptions(insecure=True)
    assert any("NOT verified" in w for w in insecure.warnings())
    assert TlsOptions().warnings() == []
    context = client_context(insecure)
    assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname
    strict = client_context(TlsOptions())
    assert strict.verify_mode == ssl.CERT_REQUIRED and strict.check_hostname
    assert strict.minimum_version == ssl.TLSVersion.TLSv1_2


def test_up_with_tls_insecure_warns_at_start_and_reaches_an_unverifiable_broker(
    cluster: LocalCluster, ca: TestAuthority
) -> None:
    server = ca.issue("brokers", ["kafka-9.elsewhere.example"])
    with TlsFront(cluster, server) as front:
        up = ManagedProcess(
            [
                sys.executable, "-m", "kafkatunnel", "up", "--no-table",
                "--bootstrap", cluster.mock[0].address,
                "--via", "exec", "--exec", front.exec_template(),
                "--listen", f"127.0.0.1:{free_port_run(8)}", "--tls", "--tls-insecure",
            ],
            name="kafkatunnel-up-insecure",
        )  # fmt: skip
        try:
            bootstrap = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=30).group(1)
            assert produce(bootstrap, f"insecure-{uuid.uuid4().hex[:6]}", 3) == 3
        finally:
            up.stop()
    assert "--tls-insecure: broker certificates are NOT verified" in " ".join(up.output().split())


def test_client_tls_serves_ssl_clients_with_the_tunnels_own_ca(
    cluster: LocalCluster, ca: TestAuthority, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TLS on both sides: clients keep security.protocol=SSL, trusting the CA the tunnel
    made (kept across starts); a plaintext client on the same port fails alone."""
    monkeypatch.setenv("KAFKATUNNEL_STATE_DIR", str(tmp_path / "state"))
    server = ca.issue("brokers", [ADVERTISED])
    front = TlsFront(cluster, server)
    config = TunnelConfig(
        bootstrap=cluster.mock[0].address, listen_port=free_port_run(8), control=False,
        start_timeout=10, tls=client_context(TlsOptions(ca.pem)),
        client_tls=listener_tls("127.0.0.1"),
    )  # fmt: skip
    with front, BackgroundTunnel(config, ExecForwarder(front.exec_template())) as tunnel:
        local_ca = Path(tunnel.status()["client_tls"]["ca"])
        assert local_ca.parent == tmp_path / "state" / "client-ca"
        assert (local_ca.parent / "ca.key").stat().st_mode & 0o077 == 0
        ssl_client = {"security.protocol": "SSL", "ssl.ca.location": str(local_ca)}
        topic = f"client-tls-{uuid.uuid4().hex[:6]}"
        bootstrap = tunnel.bootstrap_servers
        assert produce(bootstrap, topic, 10, config=ssl_client) == 10
        plaintext = consume_group(bootstrap, f"{topic}-p", topic, 10, timeout=5)
        assert plaintext.consumed == 0
        result = consume_group(bootstrap, f"{topic}-g", topic, 10, timeout=60, config=ssl_client)
        assert result.consumed == 10, result.errors[:3]
        errors = [e["last_error"] for e in tunnel.status()["endpoints"] if e["last_error"]]
        assert any("security.protocol=SSL" in e for e in errors), errors
    again = listener_tls("127.0.0.1")  # the next start: the same CA, clients keep their file
    assert again.ca == local_ca


def test_plaintext_clients_of_client_tls_are_logged_once_then_counted(
    cluster: LocalCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Clients left without security.protocol=SSL (a wrong --client-tls setup) fail each
    connection, each at its own address (port): the log says the first in full, with the
    fix, and counts the rest once the window passed."""
    monkeypatch.setenv("KAFKATUNNEL_STATE_DIR", str(tmp_path / "state"))
    window = 3.0
    config = TunnelConfig(
        bootstrap=cluster.mock[0].address, listen_port=free_port_run(8), control=False,
        client_tls=listener_tls("127.0.0.1"), repeat_window=window,
    )  # fmt: skip
    hello = request_frame(ApiVersionsRequest(client_software_name="librdkafka",
                                             client_software_version="2.13.0"))  # fmt: skip
    with (
        caplog.at_level(logging.WARNING, logger="kafkatunnel.proxy"),
        BackgroundTunnel(config, ExecForwarder(cluster.exec_template())) as tunnel,
    ):
        host, port = split_address(tunnel.bootstrap_servers)
        peers = set()
        for _ in range(30):
            with socket.create_connection((host, port), timeout=10) as client:
                peers.add(client.getsockname())
                client.sendall(hello)
                with contextlib.suppress(ConnectionResetError):  # closed on it, unread
                    assert client.recv(4096) == b""
        wait_for(
            lambda: tunnel.status()["endpoints"][0]["errors"] == 30,
            timeout=10,
            what="status to count the 30 failures",
        )

        def said() -> list[str]:
            return [r.getMessage() for r in caplog.records if ": TLS: " in r.getMessage()]

        wait_for(lambda: len(said()) == 2, timeout=window + 15, what="the count")
    assert len(peers) == 30
    first, counted = said()
    assert first.startswith(f"{tunnel.bootstrap_servers}: client 127.0.0.1:"), first
    assert "(--client-tls: clients use security.protocol=SSL" in first, first
    assert counted == (f"{tunnel.bootstrap_servers}: 29 more connections failed the same way "
                       f"in the last {window:g} s: {first.split(': ', 1)[1]}")  # fmt: skip


@VIAS
def test_the_brokers_close_notify_ends_the_clients_connection_and_sasl_stays_unrecorded(
    cluster: LocalCluster, ca: TestAuthority, tmp_path: Path, via: str
) -> None:
    """SASL/PLAIN as clients send it (SaslHandshake v1, then SaslAuthenticate) through a
    tunnel that speaks TLS to the broker. The mock cluster has no SASL and hangs up; its
    TLS listener then sends close_notify, which must end the client's connection (it once
    left the client waiting). The recording has the handshake but not the password."""
    server = ca.issue("brokers", [ADVERTISED])
    recordings = tmp_path / "recorded"
    front = TlsFront(cluster, server)
    tunnel = _tunnel(cluster, front, TlsOptions(ca.pem), record_dir=recordings, via=via)
    token = b"\x00alice\x00" + PASSWORD
    with front, tunnel:
        host, port = split_address(tunnel.bootstrap_servers)
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(request_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1))
            sock.sendall(request_frame(SaslAuthenticateRequest(auth_bytes=token), 2))
            assert sock.recv(65536) == b""  # ended, well before the 10 s timeout
    files = sorted(recordings.iterdir())
    data = b"".join(path.read_bytes() for path in files)
    assert files and PASSWORD not in data and b"alice" not in data
    assert b"PLAIN" in data  # the handshake itself is recorded: the frames are there


PASSWORD = b"s3cr3t-Pa55w0rd"


@VIAS
def test_a_client_that_stops_reading_gets_every_answer_in_order_over_tls(
    cluster: LocalCluster, ca: TestAuthority, via: str
) -> None:
    """~20 MB of answers back up through TLS both ways: the broker's TLS writes wait, the
    tunnel's TLS reads stop and resume with records OpenSSL already holds; another client
    carries on meanwhile, and once the stalled one reads, nothing is lost or reordered."""
    server = ca.issue("brokers", [ADVERTISED])
    front = TlsFront(cluster, server)
    with front, _tunnel(cluster, front, TlsOptions(ca.pem), via=via) as tunnel:
        topic = f"tls-stall-{uuid.uuid4().hex[:6]}"

        def another_client_carries_on() -> None:
            assert produce(tunnel.bootstrap_servers, topic, 20) == 20

        stalled_client_gets_every_answer(tunnel.bootstrap_servers, another_client_carries_on)
        assert tunnel.status()["endpoints"][0]["errors"] == 0


def test_scram_crosses_tls_to_tansus_authenticator_and_its_verdict_comes_back(
    ca: TestAuthority, tmp_path: Path
) -> None:
    """SASL_SSL in the cluster, SASL_PLAINTEXT to the tunnel: a SCRAM-SHA-512 client's
    SaslHandshake and SaslAuthenticate cross the tunnel's TLS, verified against the
    broker's Kubernetes-style name, to tansu 0.6's authenticator (`--authentication`), and
    its answer comes back as tansu sent it. That answer is `unknown-user`: tansu 0.6 keeps
    SCRAM users only in storage this build lacks, and creates none before a client has
    authenticated, so no user can log in. The recording keeps neither user nor nonce."""
    name = "kafka-0.kafka-headless.shop.svc.cluster.local"
    server = ca.issue("tansu", [name])
    broker_port, front_port = free_port_run(1), free_port_run(1)
    recordings = tmp_path / "recorded"
    broker = start_tansu(broker_port, f"{name}:9093", authentication=True, silent=True)
    front = ManagedProcess(
        [
            "socat",
            f"OPENSSL-LISTEN:{front_port},bind=127.0.0.1,reuseaddr,fork,"
            f"cert={server.cert},key={server.key},verify=0",
            f"TCP:127.0.0.1:{broker_port}",
        ],
        name="socat-tls-front",
    )
    try:
        front.wait_accepting(front_port, timeout=10)
        config = TunnelConfig(
            bootstrap=f"{name}:9093", listen_port=free_port_run(8), control=False,
            start_timeout=10, tls=client_context(TlsOptions(ca.pem)), record_dir=recordings,
        )  # fmt: skip
        forwarder = DirectForwarder({(name, 9093): ("127.0.0.1", front_port)})
        with BackgroundTunnel(config, forwarder) as tunnel:
            errors: list[str] = []
            client = confluent_kafka.Producer(
                {
                    "bootstrap.servers": tunnel.bootstrap_servers,
                    "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanism": "SCRAM-SHA-512",
                    "sasl.username": "alice",
                    "sasl.password": PASSWORD.decode(),
                    "error_cb": lambda error: errors.append(str(error)),
                    "log_level": 0,
                }
            )

            def refused() -> bool:
                client.poll(0.1)
                return any("unknown-user" in e for e in errors)

            wait_for(refused, timeout=20, what="tansu's SCRAM answer through the tunnel")
            assert any("state AUTH_REQ" in e for e in errors), errors  # past the handshake
            session = tunnel.status()["endpoints"][0]["tls"]
            assert session["names"] == [f"DNS:{name}"], session
    finally:
        front.stop()
        broker.stop()
    data = b"".join(path.read_bytes() for path in sorted(recordings.iterdir()))
    assert b"SCRAM-SHA-512" in data  # the handshake is recorded
    assert b"alice" not in data and b"n,,n=" not in data and PASSWORD not in data


@pytest.mark.parametrize("form", ["pem-password-file", "pkcs12-variable"])
def test_up_logs_in_with_a_client_certificate_from_its_flags(
    cluster: LocalCluster, ca: TestAuthority, tmp_path: Path, form: str
) -> None:
    """The client certificate flags as users type them, against a listener that requires
    one: --tls-cert/--tls-key with an encrypted key and --tls-password-file, and
    --tls-pkcs12 with the password in KAFKATUNNEL_TLS_PASSWORD."""
    server = ca.issue("brokers", [ADVERTISED])
    client = ca.issue("developer", ["developer"], client=True, password=b"p12-s3cret")
    env: dict[str, str] = {}
    if form == "pem-password-file":
        secret = tmp_path / "password"
        secret.write_text("p12-s3cret\n")
        flags = ["--tls-cert", str(client.cert), "--tls-key", str(client.key),
                 "--tls-password-file", str(secret)]  # fmt: skip
    else:
        flags = ["--tls-pkcs12", str(client.p12)]
        env["KAFKATUNNEL_TLS_PASSWORD"] = "p12-s3cret"
    with TlsFront(cluster, server, client_ca=ca.pem) as front:
        up = ManagedProcess(
            [
                sys.executable, "-m", "kafkatunnel", "up", "--no-table",
                "--bootstrap", cluster.mock[0].address, "--via", "exec",
                "--exec", front.exec_template(), "--listen", f"127.0.0.1:{free_port_run(8)}",
                "--tls", "--tls-ca", str(ca.pem), *flags,
            ],
            name=f"kafkatunnel-up-{form}", env=env,
        )  # fmt: skip
        try:
            bootstrap = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=30).group(1)
            assert produce(bootstrap, f"mtls-flags-{uuid.uuid4().hex[:6]}", 5) == 5
        finally:
            up.stop()
