"""`up --sasl-mechanism OAUTHBEARER`: the tunnel asks a real identity provider (Keycloak,
tests/worlds/keycloak.py) for tokens with the client credentials grant and logs in with
them on Apache Kafka's `oauth` listener, where Kafka's own validator checks each token
against the realm's keys, audience and issuer. The clients (librdkafka, the Java client,
a pure-JavaScript client) are given `bootstrap.servers` and nothing else; Keycloak's and
Kafka's own answers say whether the login was right."""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka

from kafkatunnel.demo.apache import broker_host
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.demo.workload import produce
from kafkatunnel.waiting import wait_for
from tests.apache.test_clients import every_coordinator, java, javascript, js_client
from tests.apache.test_login import (
    MESSAGES,
    groups_everywhere,
    nowhere_but_the_produce,
    secret_file,
    status,
    stopped_at_start,
    up,
    up_argv,
)
from tests.apache.test_reauthentication import client_stats, connected, connections_to_brokers
from tests.worlds.apache import LISTENERS, ApacheKafka
from tests.worlds.keycloak import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    BRIEF_CLIENT_ID,
    BRIEF_LIFESPAN,
    CLIENT_ID,
    CLIENT_SECRET,
    ELSEWHERE_CLIENT_ID,
    KEYCLOAK_VERSION,
    REALM,
    Keycloak,
    realm,
)

__all__ = ["js_client"]  # a fixture, used by name
ROOT = Path(__file__).resolve().parents[2]
INVALID_TOKEN = '{"status":"invalid_token"}'  # what Kafka's OAuthBearerSaslServer says


def keycloak_of(kafka: ApacheKafka) -> Keycloak:
    assert kafka.keycloak is not None, "the apache_kafka fixture starts Keycloak"
    return kafka.keycloak


def oauth_flags(kafka: ApacheKafka, secret: Path, client: str = CLIENT_ID) -> list[str]:
    return ["--sasl-mechanism", "OAUTHBEARER",
            "--sasl-token-endpoint", keycloak_of(kafka).token_endpoint,
            "--sasl-client-id", client, "--sasl-client-secret-file", str(secret)]  # fmt: skip


def logins(read: dict[str, object]) -> dict[str, dict[str, object]]:
    endpoints = read["endpoints"]
    assert isinstance(endpoints, list)
    return {e["advertised"]: e["login"] for e in endpoints}


def test_oauthbearer_clients_with_no_settings_on_every_coordinator(
    apache_kafka: ApacheKafka, java_classes: str, js_client: str, tmp_path: Path
) -> None:
    """The tunnel logs in with Keycloak's token on every connection: librdkafka, a Java
    consumer and a pure-JavaScript client (bootstrap.servers, group.id, nothing else)
    produce and consume in groups on every coordinator; status names the client and the
    token's expiry per broker."""
    flags = oauth_flags(apache_kafka, secret_file(tmp_path, CLIENT_SECRET))
    with up(apache_kafka, "oauth", *flags) as (bootstrap, process):
        groups_everywhere(apache_kafka, bootstrap, "oauth-rdkafka")
        every_coordinator(apache_kafka, bootstrap, "oauth-java", java(java_classes, "classic"))
        every_coordinator(apache_kafka, bootstrap, "oauth-js", javascript(js_client, "kafkajs"))
        read, shown = status(bootstrap)
        said = process.output()
    oauth = LISTENERS["oauth"]
    found = logins(read)
    assert set(found) >= {f"{broker_host(n)}:{oauth}" for n in range(3)}, found
    now = time.time()
    for login in found.values():
        assert (login["principal"], login["mechanism"], login["error"]) == (
            CLIENT_ID, "OAUTHBEARER", None)  # fmt: skip
        expires = login["token_expires_at"]
        assert isinstance(expires, float) and now < expires < now + 400, login
    flat = " ".join(shown.split())
    assert f"as {CLIENT_ID} (OAUTHBEARER), token until" in flat, shown
    assert f"SASL: the tunnel logs in as {CLIENT_ID} with OAUTHBEARER (tokens from " \
        f"{keycloak_of(apache_kafka).token_endpoint})" in " ".join(said.split())  # fmt: skip


def test_the_token_is_refreshed_before_it_expires_and_new_connections_use_it(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """A client whose tokens live BRIEF_LIFESPAN seconds: a second token is fetched at 80%
    of the first one's lifetime, before it ends, and the connections opened after it log in
    with it (status shows each broker's token expiry move on, by less than a lifetime)."""
    flags = oauth_flags(apache_kafka, secret_file(tmp_path, CLIENT_SECRET), BRIEF_CLIENT_ID)
    topic = f"oauth-refresh-{uuid.uuid4().hex[:6]}"
    with up(apache_kafka, "oauth", *flags) as (bootstrap, _):
        assert produce(bootstrap, topic, 6) == 6
        first = {a: login["token_expires_at"] for a, login in logins(status(bootstrap)[0]).items()
                 if login["token_expires_at"] is not None}  # fmt: skip
        assert first, "no broker logged in"
        expiry = max(v for v in first.values() if isinstance(v, float))

        def new_token_used() -> float | None:
            assert produce(bootstrap, topic, 3, timeout=20) == 3  # new connections
            seen = [login["token_expires_at"] for login in logins(status(bootstrap)[0]).values()]
            later = [v for v in seen if isinstance(v, float) and v > expiry]
            return min(later) if later else None  # the second token (not a third, if slow)

        moved = wait_for(new_token_used, timeout=3 * BRIEF_LIFESPAN, interval=2,
                         what="a broker's login with a second token")  # fmt: skip
    # The second token was issued before the first one ended: 80% of a lifetime later
    assert 0 < moved - expiry < BRIEF_LIFESPAN - 1, (expiry, moved)


def test_a_wrong_client_secret_stops_up_at_start_with_the_endpoints_message(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    wrong = "not-the-client-s3cret"
    endpoint = keycloak_of(apache_kafka).token_endpoint
    flags = oauth_flags(apache_kafka, secret_file(tmp_path, wrong))
    told, output = stopped_at_start(apache_kafka, "oauth", tmp_path, *flags)
    assert (f"the tunnel cannot log in: the token endpoint refused client {CLIENT_ID} at "
            f"{endpoint} (HTTP 401): unauthorized_client: Invalid client or Invalid client "
            "credentials; check the client id and the secret (--sasl-client-secret-file "
            f"{tmp_path / 'password'})") in told, told  # fmt: skip
    assert wrong not in output


def test_a_token_the_broker_refuses_stops_up_at_start_with_kafkas_message(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """A client whose tokens are for some other audience: Keycloak gives them, Kafka's
    validator refuses them, and up says what Kafka said, naming the mechanism and client."""
    flags = oauth_flags(apache_kafka, secret_file(tmp_path, CLIENT_SECRET), ELSEWHERE_CLIENT_ID)
    told, _ = stopped_at_start(apache_kafka, "oauth", tmp_path, *flags)
    assert (f"the tunnel cannot log in: broker {apache_kafka.bootstrap('oauth')}: login as "
            f"{ELSEWHERE_CLIENT_ID} with OAUTHBEARER failed: {INVALID_TOKEN} "
            "(SASL_AUTHENTICATION_FAILED); the broker does not take the token of "
            "--sasl-client-secret-file") in told, told  # fmt: skip


def realm_token(keycloak: Keycloak) -> str:
    """A token of the realm, asked for by the test itself (its JWT header is every token's
    of the realm: the algorithm and the realm key's id)."""
    basic = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
    request = urllib.request.Request(keycloak.token_endpoint, data=b"grant_type=client_credentials",
                                     headers={"Authorization": f"Basic {basic}"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as answer:
        token = json.loads(answer.read())["access_token"]
    assert isinstance(token, str)
    return token


def test_no_token_client_secret_or_bearer_is_recorded_logged_or_shown(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """The tunnel's OAUTHBEARER frames never enter a recording, nor a token (any token of
    the realm begins with the same JWT header), the word Bearer, the client secret or the
    HTTP Basic credentials it is sent in, in the recording, up's output or status. The
    control: the same recording holds the client's Produce to the topic."""
    recordings = tmp_path / "recordings"
    flags = [*oauth_flags(apache_kafka, secret_file(tmp_path, CLIENT_SECRET)),
             "--record", str(recordings), "--record-payloads"]  # fmt: skip
    argv = up_argv(apache_kafka, "oauth", *flags)
    argv.insert(argv.index("up"), "-v")  # the log at INFO: the token's fetch is in it
    topic = f"oauth-secret-{uuid.uuid4().hex[:6]}"
    process = ManagedProcess(argv, name="kafkatunnel-up-oauth-secret")
    try:
        bootstrap = process.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=60).group(1)
        assert produce(bootstrap, topic, MESSAGES) == MESSAGES
        read, shown = status(bootstrap)
    finally:
        process.stop()
    said = process.output()
    header = realm_token(keycloak_of(apache_kafka)).split(".")[0]
    basic = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode())
    secrets = [CLIENT_SECRET.encode(), basic, b"Bearer", b"auth=", header.encode()]
    assert f"a token for client {CLIENT_ID} at" in said, said  # logged, the token not
    nowhere_but_the_produce(secrets, recordings, said, (read, shown), topic)


class Admin:
    """Keycloak's admin REST API as its administrator (keycloak.py's ADMIN_USER)."""

    def __init__(self, keycloak: Keycloak) -> None:
        self.base = f"http://127.0.0.1:{keycloak.port}"

    def token(self) -> str:
        """The administrator's token (one per call: they live a minute)."""
        who = {"username": ADMIN_USER, "password": ADMIN_PASSWORD}
        form = urllib.parse.urlencode({"grant_type": "password", "client_id": "admin-cli", **who})
        token_url = f"{self.base}/realms/master/protocol/openid-connect/token"
        with urllib.request.urlopen(token_url, data=form.encode(), timeout=30) as answer:
            token = json.loads(answer.read())["access_token"]
        assert isinstance(token, str)
        return token

    def call(self, method: str, path: str, body: object = None) -> tuple[int, Any, str]:
        """HTTP status, JSON answer (None: no body) and Location of /admin/realms/REALM/path."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.base}/admin/realms/{REALM}/{path}", data=data, method=method,
            headers={"Authorization": f"Bearer {self.token()}",
                     "Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as answer:
            read = answer.read()
            return answer.status, json.loads(read) if read else None, answer.headers["Location"]


ROTATED_LIFESPAN = 50  # seconds: the refresh at 40 s, the token sent until 49 s


def test_a_client_secret_changed_while_up_runs(apache_kafka: ApacheKafka, tmp_path: Path) -> None:
    """The client's secret regenerated in Keycloak while `up` runs (a client of its own,
    tokens of ROTATED_LIFESPAN s). A producer connected before keeps producing on its
    connections; the refresh, at 80% of the token's lifetime, is refused: logged and in
    status, and the token held is still what new connections log in with until its last
    second. After it, a new client is refused: status, the table and the log say the token
    ended and what Keycloak said (RFC 6749's error and description, naming the client and
    the endpoint); the producer's connections end with the broker's session, which Kafka
    ends with the token. No secret, old or new, nor a token, is in the log or status."""
    keycloak = keycloak_of(apache_kafka)
    admin = Admin(keycloak)
    client_id = f"kafkatunnel-rotated-{uuid.uuid4().hex[:6]}"
    clients = realm()["clients"]
    assert isinstance(clients, list)
    (brief,) = [c for c in clients if c["clientId"] == BRIEF_CLIENT_ID]
    attributes = {"access.token.lifespan": str(ROTATED_LIFESPAN)}
    created, _, where = admin.call("POST", "clients", {**brief, "clientId": client_id,
                                                       "attributes": attributes})  # fmt: skip
    assert created == 201, created
    internal_id = where.rsplit("/", 1)[1]
    endpoint = keycloak.token_endpoint
    secret = secret_file(tmp_path, CLIENT_SECRET)
    refusal = (f"the token endpoint refused client {client_id} at {endpoint} (HTTP 401): "
               "unauthorized_client: Invalid client or Invalid client credentials; check the "
               f"client id and the secret (--sasl-client-secret-file {secret})")  # fmt: skip
    flags = oauth_flags(apache_kafka, secret, client_id)
    topic = f"oauth-rotated-{uuid.uuid4().hex[:6]}"
    stats: dict[str, Any] = {}
    acknowledged: list[bool] = []
    produced = 0
    try:
        with up(apache_kafka, "oauth", *flags) as (bootstrap, process):
            producer = confluent_kafka.Producer({
                "bootstrap.servers": bootstrap, "linger.ms": 0, "statistics.interval.ms": 200,
                "stats_cb": client_stats(stats)})  # fmt: skip

            def produce_one() -> None:
                nonlocal produced
                produced += 1
                producer.produce(topic, b"m", on_delivery=lambda e, _m: acknowledged.append(
                    e is None))  # fmt: skip
                producer.poll(0.05)

            def producing_everywhere() -> bool:
                produce_one()
                return any(acknowledged) and connected(stats, 3)

            wait_for(producing_everywhere, timeout=30, what="the producer connected to "
                     "every broker")  # fmt: skip
            regenerated, new, _ = admin.call("POST", f"clients/{internal_id}/client-secret")
            assert regenerated == 200 and new["value"] != CLIENT_SECRET, regenerated
            new_secret = new["value"]
            held = r"OAUTHBEARER: the token was not refreshed \(the token held ends at [\d:]+\): "
            not_refreshed = re.compile(held + re.escape(refusal))

            def refresh_refused() -> bool:
                produce_one()
                return any(not_refreshed.search(line) for line in list(process.lines))

            wait_for(refresh_refused, timeout=ROTATED_LIFESPAN, what="the refresh refused")
            # status at once, while the token held is surely valid (the refresh came at 80%
            # of its life; what follows may take seconds on a busy machine)
            valid, valid_shown = status(bootstrap)
            # the token held, still valid: a new client's connections log in with it, and
            # the producer goes on on the connections it has (the topic is there: the new
            # client only connects)
            assert produce(bootstrap, topic, 3, timeout=4) == 3
            for _ in range(10):
                produce_one()
            producer.flush(4)
            assert acknowledged.count(True) == produced, (produced, acknowledged.count(False))
            counts = connections_to_brokers(stats)
            assert counts and all(c == ("UP", 1, 0) for c in counts.values()), counts
            # the token held now (a refresh before the secret changed may have replaced the
            # first, with later setup on a loaded machine)
            held_now = logins(valid)[apache_kafka.bootstrap("oauth")]
            expires = held_now["token_expires_at"]
            assert isinstance(expires, float), held_now
            wait_for(lambda: time.time() > expires, timeout=ROTATED_LIFESPAN,
                     what="the token's end")  # fmt: skip
            refused = {"message.timeout.ms": 4000}
            assert produce(bootstrap, f"{topic}-late", 1, config=refused, timeout=8) == 0
            read, shown = status(bootstrap)
            said = process.output()
    finally:
        admin.call("DELETE", f"clients/{internal_id}")
    ended = r"the token ended at \d\d:\d\d:\d\d and no new one came: " + re.escape(refusal)
    # while the token held was valid: the refusal said, no login failed
    for address, login in logins(valid).items():
        told = login["token_error"]
        assert isinstance(told, str) and told.startswith(refusal), (address, login)
        assert login["error"] is None, (address, login)
    flat = " ".join(valid_shown.split())
    assert ", not refreshed" in flat and f"token not refreshed: {refusal}" in flat, valid_shown
    # after it ended: the new client refused with Keycloak's words, in status and the log
    boot = [e for e in read["endpoints"] if e["advertised"] == apache_kafka.bootstrap("oauth")]
    assert re.search(ended, boot[0]["last_error"] or ""), boot
    assert re.search(ended, boot[0]["login"]["error"] or ""), boot
    assert re.search(ended, " ".join(shown.split())), shown
    assert re.search(rf"upstream {re.escape(apache_kafka.bootstrap('oauth'))}: {ended}", said), said
    header = realm_token(keycloak).split(".")[0]
    secrets = [CLIENT_SECRET, new_secret, "Bearer", header]
    for where_, text in {"up's output": said, "status": json.dumps(read) + shown}.items():
        for hidden in secrets:
            assert hidden not in text, (where_, hidden)


def test_the_fetched_keycloak_is_the_one_the_tests_run() -> None:
    """scripts/keycloak/pom.xml (what the set-up fetches) is the one place its version is
    changed: the launcher's constant agrees with it."""
    pom = (ROOT / "scripts" / "keycloak" / "pom.xml").read_text()
    assert f"<keycloak.version>{KEYCLOAK_VERSION}</keycloak.version>" in pom
