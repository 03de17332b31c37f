"""The tunnel logs in for its clients, on Apache Kafka's own SASL listeners: SCRAM-SHA-512
over TLS (Strimzi's `scram-sha-512` listener), SCRAM-SHA-256 and PLAIN in plaintext. The
clients (librdkafka, the Java client) are given `bootstrap.servers` and nothing else;
Kafka's own answers say whether the login was right."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from confluent_kafka.cimpl import NewTopic
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from kafkatunnel.demo import free_port_run
from kafkatunnel.demo.apache import HEAP, broker_host
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.demo.workload import consume_groups, produce
from kafkatunnel.protocol import (
    FrameDecoder,
    LoggedIn,
    Login,
    Scram,
    response_body_offset,
    response_correlation_id,
)
from kafkatunnel.waiting import wait_for
from tests.apache.test_apache_kafka import (
    commit_and_abort_on_every_coordinator,
    recorded_messages,
    refused_login,
    tls_flags,
)
from tests.apache.test_clients import every_coordinator, java, javascript, js_client
from tests.kio_messages import decode, request_frame
from tests.tunnel.container import HOST_ADDRESS, Container
from tests.worlds.apache import LISTENERS, SCRAM_PASSWORD, SCRAM_USER, ApacheKafka

MESSAGES = 30
INVALID_CREDENTIALS = ("Authentication failed during authentication due to invalid "
                       "credentials with SASL mechanism {}")  # Kafka's own words  # fmt: skip
PASSWORD_VARIABLE = "KT_TEST_SASL_PASSWORD"
NOBODY = 65534  # another user of the machine
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"

__all__ = ["js_client"]  # a fixture, used by name


def login_flags(mechanism: str, password_file: Path, user: str = SCRAM_USER) -> list[str]:
    return ["--sasl-mechanism", mechanism, "--sasl-username", user,
            "--sasl-password-file", str(password_file)]  # fmt: skip


def up_argv(kafka: ApacheKafka, listener: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", "kafkatunnel", "up", "--no-table",
            "--bootstrap", kafka.bootstrap(listener), "--exec", kafka.exec_template(),
            "--listen", f"127.0.0.1:{free_port_run(8)}", *flags]  # fmt: skip


def stopped_at_start(
    kafka: ApacheKafka, listener: str, directory: Path, *flags: str
) -> tuple[str, str]:
    """Run `up` that must stop at start: exit status 2 and no traceback (asserted); what it
    said, on one line, and its whole output (to search for secrets)."""
    result = subprocess.run(up_argv(kafka, listener, *flags), capture_output=True, text=True,
                            timeout=120, cwd=directory)  # fmt: skip
    told = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in told, told
    return told, result.stdout + result.stderr


@contextmanager
def up(
    kafka: ApacheKafka, listener: str, *flags: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, ManagedProcess]]:
    """`kafkatunnel up` in front of a listener; yields its bootstrap.servers and itself."""
    process = ManagedProcess(up_argv(kafka, listener, *flags), env=env,
                             name=f"kafkatunnel-up-login-{listener}")  # fmt: skip
    try:
        yield process.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=60).group(1), process
    finally:
        process.stop()


def status(bootstrap: str) -> tuple[dict[str, Any], str]:
    """`status --json` as read, and `status` as a person sees it."""
    port = bootstrap.split(",")[0].rsplit(":", 1)[1]
    run = [sys.executable, "-m", "kafkatunnel", "status", "--port", port]
    wide = {**os.environ, "COLUMNS": "1000"}  # every cell whole, on one line
    shown = subprocess.run(run, capture_output=True, text=True, check=True, timeout=30,
                           env=wide)  # fmt: skip
    read = subprocess.run([*run, "--json"], capture_output=True, text=True, check=True,
                          timeout=30)  # fmt: skip
    return json.loads(read.stdout), shown.stdout


def secret_file(directory: Path, password: str) -> Path:
    path = directory / "password"
    path.write_text(password + "\n")
    path.chmod(0o600)
    return path


def groups_everywhere(kafka: ApacheKafka, bootstrap: str, prefix: str) -> None:
    """librdkafka with no setting but bootstrap.servers: MESSAGES produced, then read by a
    group on each coordinator."""
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    assert produce(bootstrap, topic, MESSAGES) == MESSAGES
    groups = {gs[0]: MESSAGES for gs in
              kafka.groups_by_coordinator(1, prefix=f"{topic}-g").values()}  # fmt: skip
    for group, result in consume_groups(bootstrap, groups, topic, timeout=60).items():
        assert (result.consumed, result.coordinator_errors) == (MESSAGES, []), group


def test_scram_sha_512_over_tls_clients_with_no_settings_on_every_coordinator(
    apache_kafka: ApacheKafka, java_classes: str, tmp_path: Path
) -> None:
    """Strimzi's SCRAM-over-TLS listener: the tunnel speaks TLS and logs in as alice;
    librdkafka and a Java consumer (bootstrap.servers and group.id, no security setting)
    produce and consume in groups on every coordinator; status names alice per broker."""
    flags = [*tls_flags(apache_kafka),
             *login_flags("SCRAM-SHA-512", secret_file(tmp_path, SCRAM_PASSWORD))]  # fmt: skip
    with up(apache_kafka, "scram", *flags) as (bootstrap, process):
        groups_everywhere(apache_kafka, bootstrap, "login-512")
        every_coordinator(apache_kafka, bootstrap, "login-java", java(java_classes, "classic"))
        read, shown = status(bootstrap)
    logins = {e["advertised"]: e["login"] for e in read["endpoints"]}
    scram = LISTENERS["scram"]
    assert set(logins) >= {f"{broker_host(n)}:{scram}" for n in range(3)}, logins
    for login in logins.values():
        assert (login["principal"], login["mechanism"], login["error"]) == (
            SCRAM_USER, "SCRAM-SHA-512", None)  # fmt: skip
        assert login["session_lifetime_ms"] == 0  # connections.max.reauth.ms: Kafka's default
    assert "as alice (SCRAM-SHA-512)" in " ".join(shown.split()), shown
    assert "SASL: the tunnel logs in as alice with SCRAM-SHA-512" in process.output()


@pytest.mark.parametrize(("listener", "mechanism"), [("scram256", "SCRAM-SHA-256"),
                                                     ("sasl", "PLAIN")])  # fmt: skip
def test_scram_sha_256_and_plain_in_plaintext_with_the_password_from_a_variable(
    apache_kafka: ApacheKafka, listener: str, mechanism: str
) -> None:
    env = {**os.environ, PASSWORD_VARIABLE: SCRAM_PASSWORD}
    flags = ["--sasl-mechanism", mechanism, "--sasl-username", SCRAM_USER,
             "--sasl-password-env", PASSWORD_VARIABLE]  # fmt: skip
    with up(apache_kafka, listener, *flags, env=env) as (bootstrap, _):
        groups_everywhere(apache_kafka, bootstrap, f"login-{listener}")
        read, _shown = status(bootstrap)
    assert {e["login"]["principal"] for e in read["endpoints"]} == {SCRAM_USER}


@pytest.mark.parametrize(
    ("listener", "mechanism", "said"),
    [
        ("scram", "SCRAM-SHA-512", INVALID_CREDENTIALS.format("SCRAM-SHA-512")),
        ("scram256", "SCRAM-SHA-256", INVALID_CREDENTIALS.format("SCRAM-SHA-256")),
        ("sasl", "PLAIN", "Authentication failed: Invalid username or password"),
        ("scram256", "PLAIN", "the listener does not enable PLAIN (it enables: SCRAM-SHA-256)"),
    ],
)
def test_a_wrong_login_stops_up_at_start_with_kafkas_message(
    apache_kafka: ApacheKafka, tmp_path: Path, listener: str, mechanism: str, said: str
) -> None:
    wrong = "not-alices-password"
    flags = login_flags(mechanism, secret_file(tmp_path, wrong))
    if listener == "scram":
        flags += tls_flags(apache_kafka)
    told, output = stopped_at_start(apache_kafka, listener, tmp_path, *flags)
    assert f"the tunnel cannot log in: broker {apache_kafka.bootstrap(listener)}: login as " \
        f"{SCRAM_USER} with {mechanism} failed: {said}" in told, told  # fmt: skip
    assert wrong not in output


def scram_keys(kafka: ApacheKafka, mechanism: str, listener: str) -> list[bytes]:
    """What SCRAM derives from alice's password with the salt Kafka keeps for her: the
    salted password, the client key, the stored key and the server key, as bytes and in
    base64 (how SCRAM carries them). Asked of the broker with a login of our own."""
    seen: list[bytes] = []

    class Watching(Scram):
        def answer(self, challenge: bytes) -> bytes | None:
            seen.append(challenge)
            return super().answer(challenge)

    login = Login(Watching(mechanism, SCRAM_USER, SCRAM_PASSWORD.encode()))
    with kafka.connect(broker_host(0), LISTENERS[listener], timeout=10) as sock:
        sock.sendall(login.start())
        while login.outcome is None:
            data = sock.recv(65536)
            if not data:
                login.ended()
            for request in login.feed(data):
                sock.sendall(request)
    assert isinstance(login.outcome, LoggedIn), login.outcome
    fields = dict(part.split(b"=", 1) for part in seen[0].split(b","))
    name = mechanism.removeprefix("SCRAM-").replace("-", "").lower()
    salted = hashlib.pbkdf2_hmac(name, SCRAM_PASSWORD.encode(), base64.b64decode(fields[b"s"]),
                                 int(fields[b"i"]))  # fmt: skip
    client_key = hmac.new(salted, b"Client Key", name).digest()
    keys = [salted, client_key, hashlib.new(name, client_key).digest(),
            hmac.new(salted, b"Server Key", name).digest()]  # fmt: skip
    return keys + [base64.b64encode(k) for k in keys]


def test_no_secret_is_recorded_logged_or_shown_and_the_connections_are(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """The tunnel's login frames never enter a recording (they are not the client's), nor
    the password, a SCRAM message (the client's proof among them) or what SCRAM derives
    from the password, in the recording, up's output or status. The control: the same
    recording holds the client's Produce to the topic."""
    recordings = tmp_path / "recordings"
    flags = [*login_flags("SCRAM-SHA-256", secret_file(tmp_path, SCRAM_PASSWORD)),
             "--record", str(recordings), "--record-payloads"]  # fmt: skip
    topic = f"login-secret-{uuid.uuid4().hex[:6]}"
    with up(apache_kafka, "scram256", *flags) as (bootstrap, process):
        assert produce(bootstrap, topic, MESSAGES) == MESSAGES
        read, shown = status(bootstrap)
        process.stop()
        said = process.output()
    secrets = [SCRAM_PASSWORD.encode(), b"c=biws", b"n,,n=" + SCRAM_USER.encode(),
               *scram_keys(apache_kafka, "SCRAM-SHA-256", "scram256")]  # fmt: skip
    nowhere_but_the_produce(secrets, recordings, said, (read, shown), topic)


def nowhere_but_the_produce(
    secrets: list[bytes], recordings: Path, said: str, status_read: tuple[Any, str], topic: str
) -> None:
    """No secret in the recording, up's output or status (as read and as shown); the
    control: the client's Produce to `topic` is recorded, and no SASL frame of the client."""
    read, shown = status_read
    recorded = b"".join(path.read_bytes() for path in sorted(recordings.iterdir()))
    everything = {"recording": recorded, "up's output": said.encode(),
                  "status": (json.dumps(read) + shown).encode()}  # fmt: skip
    for where, text in everything.items():
        for secret in secrets:
            assert secret not in text, (where, secret)
    connections = recorded_messages(recordings)
    assert any(m.__api_key__ == 0 and topic in (t.name for t in m.topic_data)
               for messages in connections.values() for m, _ in messages), (
        f"no Produce to {topic} in {len(connections)} recorded connections")  # fmt: skip
    sasl = [m for messages in connections.values() for m, _ in messages if m.__api_key__ != 0]
    assert sasl == [], sasl  # no SaslHandshake, no SaslAuthenticate: the client sent none


@pytest.mark.skipif(os.geteuid() != 0, reason="a program of another user's needs root")
def test_only_the_users_own_programs_are_logged_in(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """`up` with a login says whose programs it logs in. kcat run by another user of the
    machine (nobody) is closed before a byte reaches a broker, the log names it and status
    counts it; the user's own kcat lists the cluster through the same port meanwhile."""
    flags = login_flags("SCRAM-SHA-256", secret_file(tmp_path, SCRAM_PASSWORD))
    kcat = ["kcat", "-L", "-b"]
    with up(apache_kafka, "scram256", *flags) as (bootstrap, process):
        process.wait_for_line(rf"^login: the tunnel logs in as {SCRAM_USER} \(SCRAM-SHA-256\) "
                              r"for the programs of root \(uid 0\) on this machine alone: "
                              "other users' connections are refused$", timeout=10)  # fmt: skip
        other = subprocess.run([*kcat, bootstrap, "-m", "5"], capture_output=True, text=True,
                               timeout=60, user=NOBODY, group=NOBODY, extra_groups=[],
                               cwd="/")  # fmt: skip
        process.wait_for_line(
            r"client 127\.0\.0\.1:\d+ refused: it runs as nobody \(uid "
            rf"65534\), and the tunnel logs in as {SCRAM_USER} ",
            timeout=10,
        )
        own = subprocess.run([*kcat, bootstrap, "-m", "30"], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
        read, shown = status(bootstrap)
    assert other.returncode != 0 and "brokers:" not in other.stdout, other
    assert own.returncode == 0 and f"{apache_kafka.nodes} brokers:" in own.stdout, own
    assert read["login_users"]["users"] == ["root (uid 0)"]
    assert read["login_users"]["refused"] >= 1
    assert "connection(s) of other users of this machine refused" in shown, shown


@pytest.mark.skipif(os.geteuid() != 0, reason="a container's network needs root")
def test_a_client_on_a_bridge_is_logged_in_whoever_it_runs_as_and_up_says_so_at_start(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """A container's program has no user this machine's kernel can tell: a listener on its
    bridge serves it logged in (here kcat run as nobody inside the container), and `up`
    says so at start, naming the address and the login."""
    flags = login_flags("SCRAM-SHA-256", secret_file(tmp_path, SCRAM_PASSWORD))
    with Container() as box:
        listen = f"{HOST_ADDRESS}:{free_port_run(8, host=HOST_ADDRESS)}"
        with up(apache_kafka, "scram256", *flags, "--listen", listen) as (bootstrap, process):
            inside = subprocess.run([*box.namespace.exec_prefix(), "setpriv", "--reuid",
                                     str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
                                     "kcat", "-L", "-b", bootstrap, "-m", "30"],
                                    capture_output=True, text=True, timeout=60)  # fmt: skip
        said = " ".join(process.output().split())
    assert bootstrap == listen
    assert inside.returncode == 0 and f"{apache_kafka.nodes} brokers:" in inside.stdout, inside
    assert f"warning: a client that reaches {HOST_ADDRESS} from another machine or a " \
        f"container is logged in as {SCRAM_USER} (SCRAM-SHA-256): no user of this machine's " \
        "can be told for it" in said, said  # fmt: skip


def test_a_password_changed_mid_run_fails_new_connections_with_kafkas_message(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """A user of its own (carol), her SCRAM-SHA-256 password changed while the tunnel runs:
    a client connected before keeps producing; a new client is refused, and status and
    up's log say what Kafka said, naming the mechanism and carol."""
    user, password = f"carol-{uuid.uuid4().hex[:6]}", "carols-s3cret"
    configs = ["org.apache.kafka.tools.ConfigCommand", "--bootstrap-server",
               apache_kafka.bootstrap(), "--entity-type", "users", "--entity-name", user,
               "--alter", "--add-config"]  # fmt: skip
    apache_kafka.tool(*configs, f"SCRAM-SHA-256=[iterations=4096,password={password}]")
    flags = login_flags("SCRAM-SHA-256", secret_file(tmp_path, password), user=user)
    topic = f"login-revoked-{uuid.uuid4().hex[:6]}"
    with up(apache_kafka, "scram256", *flags) as (bootstrap, process):
        before = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        try:
            assert deliver(before, topic, 6) == 6
            apache_kafka.tool(*configs, "SCRAM-SHA-256=[iterations=4096,password=changed]")
            refused = INVALID_CREDENTIALS.format("SCRAM-SHA-256")

            def new_client_refused() -> bool:
                assert produce(bootstrap, topic, 1, timeout=5) == 0  # never let in
                return any(refused in str(e.get("last_error")) for e in status(bootstrap)[0]
                           ["endpoints"])  # fmt: skip

            wait_for(new_client_refused, timeout=60, what="a new client to be refused")
            assert deliver(before, topic, 6) == 6  # the connection from before goes on
            read, shown = status(bootstrap)
        finally:
            before.flush(5)
    said = " ".join(process.output().split())
    failed = f"login as {user} with SCRAM-SHA-256 failed: {refused}"
    assert failed in said, said
    errors = [e["login"]["error"] for e in read["endpoints"] if e["login"]["error"]]
    assert errors and all(failed in error for error in errors), errors
    assert failed in " ".join(shown.split()), shown


OWN_LOGIN = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
             "sasl.username": SCRAM_USER, "sasl.password": SCRAM_PASSWORD}  # fmt: skip
JAAS = f'{SCRAM_LOGIN_MODULE} required username="{SCRAM_USER}" password="{SCRAM_PASSWORD}";'
# What each client says of the tunnel's answer to its SaslHandshake, word for word.
LIBRDKAFKA_TOLD = (
    "SASL SCRAM-SHA-256 mechanism handshake failed: Broker: Unsupported SASL mechanism: "
    "broker's supported mechanisms: none: kafkatunnel logs in,as alice (SCRAM-SHA-256),"
    "for its clients,drop security.protocol,sasl.* from this client"
)
JAVA_TOLD = (
    "Client SASL mechanism 'SCRAM-SHA-256' not enabled in the server, enabled mechanisms "
    "are [none: kafkatunnel logs in, as alice (SCRAM-SHA-256), for its clients, drop "
    "security.protocol, sasl.* from this client]"
)
AUTHENTICATE_TOLD = ("kafkatunnel logs in for its clients, as alice (SCRAM-SHA-256): drop "
                     "security.protocol and sasl.* from this client's settings")  # fmt: skip
UP_TOLD = ("sent a SASL login of its own, which the tunnel answered: the tunnel logs in as "
           f"{SCRAM_USER} (SCRAM-SHA-256); the client must not (drop its security.protocol "
           "and sasl.* settings)")  # fmt: skip


@pytest.fixture(scope="module")
def alice_up(
    apache_kafka: ApacheKafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, ManagedProcess]]:
    """One `up` in front of the SCRAM-SHA-256 listener, logging in as alice, for every
    test that needs no other flag."""
    password = secret_file(tmp_path_factory.mktemp("alice"), SCRAM_PASSWORD)
    with up(apache_kafka, "scram256", *login_flags("SCRAM-SHA-256", password)) as running:
        yield running


def java_own_login(kafka: ApacheKafka, bootstrap: str, directory: Path) -> str:
    """What Kafka's own kafka-topics (the Java AdminClient), given SASL settings of its
    own, says when it lists topics through the tunnel."""
    config = directory / "own-login.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in OWN_LOGIN.items()
                              if k != "sasl.username" and k != "sasl.password")
                      + f"sasl.jaas.config={JAAS}\n")  # fmt: skip
    argv = ["java", *HEAP, "-cp", f"{kafka.lib}/*", "org.apache.kafka.tools.TopicCommand",
            "--bootstrap-server", bootstrap, "--list", "--command-config", str(config)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    said = result.stdout + result.stderr
    assert result.returncode != 0, said
    return " ".join(said.split())


def by_hand(bootstrap: str) -> list[Any]:
    """On one connection: a SaslAuthenticate with no handshake before it (as a KIP-368
    re-authentication may send), a SaslHandshake, then a Metadata request; the answers."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    asked: list[Any] = [
        SaslAuthenticateRequest(auth_bytes=b"n,,n=alice,r=abcdef"),
        SaslHandshakeRequest(mechanism="SCRAM-SHA-256"),
        MetadataRequest(topics=None, allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False),
    ]  # fmt: skip
    answers: list[Any] = []
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        decoder = FrameDecoder()
        for correlation_id, request in enumerate(asked):
            sock.sendall(request_frame(request, correlation_id))
            got: list[bytes] = []
            while not got:
                data = sock.recv(65536)
                assert data, f"the tunnel closed the connection after {len(answers)} answers"
                got = decoder.feed(data)
            assert (response_correlation_id(got[0]), len(got)) == (correlation_id, 1)
            key, version = int(request.__api_key__), int(request.__version__)
            body = got[0][response_body_offset(got[0], key, version) :]
            answers.append(decode(load_response_schema(key, version), body))
    return answers


def test_a_client_that_logs_in_itself_is_told_by_the_tunnel_that_it_logs_in_and_as_whom(
    apache_kafka: ApacheKafka, alice_up: tuple[str, ManagedProcess], tmp_path: Path
) -> None:
    """librdkafka and the Java client with SASL settings of their own, through a tunnel
    that logs in: each says, in its own error, that kafkatunnel logs in, as alice, and
    what to drop; so do status and up's log. A SaslAuthenticate sent without a handshake
    is told the same, and the connection goes on (logged in as alice: Metadata is
    answered); the tunnel serves a client with no settings as before."""
    bootstrap, process = alice_up
    assert LIBRDKAFKA_TOLD in refused_login(bootstrap, OWN_LOGIN)
    assert JAVA_TOLD in java_own_login(apache_kafka, bootstrap, tmp_path)
    authenticated, handshake, metadata = by_hand(bootstrap)
    assert (authenticated.error_code, authenticated.error_message) == (
        ErrorCode.sasl_authentication_failed, AUTHENTICATE_TOLD)  # fmt: skip
    assert handshake.error_code == ErrorCode.unsupported_sasl_mechanism, handshake
    assert sorted((b.node_id, b.host) for b in metadata.brokers) == [
        (node, "127.0.0.1") for node in range(3)]  # the tunnel's, logged in as alice  # fmt: skip

    def said_in_status() -> bool:
        return any(UP_TOLD in str(e["last_error"]) for e in status(bootstrap)[0]["endpoints"])

    wait_for(said_in_status, timeout=30, what="status to say the tunnel answered the login")
    assert UP_TOLD in " ".join(process.output().split())
    topic = f"login-after-own-{uuid.uuid4().hex[:6]}"
    assert produce(bootstrap, topic, MESSAGES) == MESSAGES


@pytest.mark.parametrize("library", ["kafkajs", "platformatic"])
def test_javascript_clients_with_no_security_settings_on_every_coordinator(
    apache_kafka: ApacheKafka, alice_up: tuple[str, ManagedProcess], js_client: str,
    library: str,
) -> None:  # fmt: skip
    """kafkajs and @platformatic/kafka given only the tunnel's address: produce, then a
    group on every coordinator reads every message."""
    every_coordinator(apache_kafka, alice_up[0], f"login-{library}", javascript(js_client, library))


def test_transactions_through_the_login_commit_and_abort_on_every_coordinator(
    apache_kafka: ApacheKafka, alice_up: tuple[str, ManagedProcess]
) -> None:
    commit_and_abort_on_every_coordinator(apache_kafka, alice_up[0], "login-txn")


def test_read_only_and_the_login_together_each_refusal_in_its_own_words(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """`up --read-only` that logs in: a client's own login is told the tunnel logs in (and
    up's log says it once, not as a read-only refusal); creating a topic is refused as
    read-only, in Kafka's error with read-only's reason; reading goes on, logged in as
    alice."""
    flags = ["--read-only", *login_flags("SCRAM-SHA-256", secret_file(tmp_path, SCRAM_PASSWORD))]
    topic = f"login-read-only-{uuid.uuid4().hex[:6]}"
    read_only = "the tunnel is read-only (kafkatunnel up --read-only)"
    with up(apache_kafka, "scram256", *flags) as (bootstrap, process):
        assert LIBRDKAFKA_TOLD in refused_login(bootstrap, OWN_LOGIN)
        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
        assert sorted(admin.list_topics(timeout=30).brokers) == [0, 1, 2]
        creating = admin.create_topics([NewTopic(topic, 1, 1)])[topic]
        with pytest.raises(confluent_kafka.KafkaException) as raised:
            creating.result(60)
        error = raised.value.args[0]
        assert error.code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED, error
        assert read_only in error.str(), error
        wait_for(lambda: "refused CreateTopics" in process.output(), timeout=30,
                 what="up to log the refused CreateTopics")  # fmt: skip
    said = " ".join(process.output().split())
    assert UP_TOLD in said and "refused CreateTopics from client" in said, said
    assert "refused SaslHandshake" not in said, said  # said once, as the login's


def deliver(producer: confluent_kafka.Producer, topic: str, count: int) -> int:
    """`count` messages through a producer that exists already; how many were acknowledged."""
    acknowledged = []
    for i in range(count):  # every partition: a connection to each leader, from the start
        producer.produce(topic, f"m-{i}".encode(), partition=i % 3,
                         on_delivery=lambda e, _m: acknowledged.append(e is None))  # fmt: skip
    producer.flush(30)
    return sum(acknowledged)
