"""The tests' Apache Kafka: the demo's cluster (kafkatunnel.demo.apache: three KRaft nodes
advertising `kafka-N.kafka-headless.kafka.svc.cluster.local`) with Strimzi's kinds of
listener beside its plain one:

    plain  9092  PLAINTEXT
    tls    9093  SSL, the brokers' certificates from the cluster CA, naming them
    scram  9094  SASL_SSL, SCRAM-SHA-512 (users added at format time, as Kafka documents)
    mtls   9095  SSL with a client certificate from the clients CA required

and, beside Strimzi's, the other SASL logins Kafka has, in plaintext, for the same user:

    scram256  9096  SASL_PLAINTEXT, SCRAM-SHA-256 (added at format time too)
    sasl      9097  SASL_PLAINTEXT, PLAIN (the user in the listener's JAAS line)
    reauth    9099  SASL_SSL, SCRAM-SHA-512 as `scram`, with sessions of REAUTH_MS
                    (KIP-368: `connections.max.reauth.ms`, which a Strimzi Kafka's
                    config may set; a connection not logged in again before its
                    session ends is closed at its next request)

and, with `ApacheKafka(oauth=True)`, a listener whose tokens an identity provider gives
(Keycloak, keycloak.py), started beside the cluster and ready before the brokers (each
reads its keys as it starts, and does not start without them):

    oauth     9098  SASL_PLAINTEXT, OAUTHBEARER, checked by Kafka's own validator

A node can be restarted in place (`restart`), and a cluster can be ready before its offsets
topic exists (`offsets_topic=False`), as a new one is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafkatunnel.demo import apache
from kafkatunnel.demo.apache import (
    KAFKA_VERSION,
    START_TIMEOUT,
    broker_address,
    broker_host,
    node_settings,
)
from kafkatunnel.probe import METADATA, ProbeConnection
from kafkatunnel.waiting import wait_for
from tests.worlds.authority import Authority, Issued
from tests.worlds.keycloak import Keycloak

LISTENERS = {"plain": 9092, "tls": 9093, "scram": 9094, "mtls": 9095, "scram256": 9096,
             "sasl": 9097, "oauth": 9098, "reauth": 9099}  # fmt: skip
PROTOCOLS = {"plain": "PLAINTEXT", "tls": "SSL", "scram": "SASL_SSL", "mtls": "SSL",
             "scram256": "SASL_PLAINTEXT", "sasl": "SASL_PLAINTEXT",
             "oauth": "SASL_PLAINTEXT", "reauth": "SASL_SSL"}  # fmt: skip
REAUTH_MS = 3000  # the reauth listener's session lifetime
SCRAM_USER, SCRAM_PASSWORD = "alice", "alice-s3cret"
MTLS_USER = "bob"


@dataclass(frozen=True)
class Credentials:
    """What clients present: the cluster CA to trust, the SCRAM user, the mTLS user."""

    cluster_ca: Path
    clients_ca: Path
    scram_user: str
    scram_password: str
    mtls_user: Issued


def broker_settings(
    node: int,
    voters: list[str],
    address: str,
    data: Path,
    keystore: Path,
    clients_ca: Path,
    version: str = KAFKA_VERSION,
    oauth: Keycloak | None = None,
) -> dict[str, str]:
    """A node's server.properties (kafkatunnel.demo.apache.node_settings) with Strimzi's
    kinds of listener (see LISTENERS); `keystore` is its key and certificate (PEM),
    `clients_ca` signs mTLS users. The `oauth` listener only with an identity provider
    (`oauth`) that its tokens come from."""
    listeners = {k: (port, PROTOCOLS[k]) for k, port in LISTENERS.items() if k != "oauth" or oauth}
    settings = node_settings(node, voters, address, data, listeners, version)
    settings.update({
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(clients_ca),
        "listener.name.mtls.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.scram.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.scram256.sasl.enabled.mechanisms": "SCRAM-SHA-256",
        "listener.name.scram256.scram-sha-256.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.reauth.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.reauth.scram-sha-512.connections.max.reauth.ms": str(REAUTH_MS),
        "listener.name.sasl.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl.plain.sasl.jaas.config":
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_{SCRAM_USER}="{SCRAM_PASSWORD}";',
    })  # fmt: skip
    if oauth is not None:  # tokens checked by Kafka's own validator, against the realm's keys
        settings.update(oauth.broker_settings())
        settings["listener.name.oauth.sasl.enabled.mechanisms"] = "OAUTHBEARER"
        settings["listener.name.oauth.oauthbearer.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
        )
        settings["listener.name.oauth.oauthbearer.sasl.server.callback.handler.class"] = (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
        )
    return settings


class ApacheKafka(apache.ApacheKafka):
    """Start with `with ApacheKafka() as kafka:`; every process and file is gone on exit."""

    def __init__(
        self,
        nodes: int = 3,
        version: str = KAFKA_VERSION,
        offsets_topic: bool = True,
        oauth: bool = False,
    ) -> None:
        """`offsets_topic=False`: ready once every broker is up, before anything has made
        `__consumer_offsets`: the first group's look-up creates it, as on a new cluster.
        `oauth`: the `oauth` listener too, with its identity provider (`self.keycloak`)."""
        super().__init__(nodes, version)
        self.offsets_topic = offsets_topic
        self.keycloak = Keycloak() if oauth else None
        self.listeners = {k: (port, PROTOCOLS[k]) for k, port in LISTENERS.items()
                          if k != "oauth" or oauth}  # fmt: skip
        self.credentials: Credentials | None = None

    def restart(self, node: int) -> None:
        """Stop one node and start it again in place, as a deleted broker pod comes back
        with its volume: the groups it coordinated move to other brokers and, once it is
        back and leads again, return. Returns once it is in the metadata again and back in
        every partition's in-sync replicas, so that a preferred leader election run then moves
        every leadership back at once: one it could not move yet, Kafka's own rebalance
        (`auto.leader.rebalance.enable`, every 5 minutes) would move later, under whatever
        the cluster's next user is doing, and its groups' coordinators with it."""
        self.processes[node].stop(timeout=30)
        self.processes[node] = self._launch(node)
        self._wait_ready()  # a broker again, and its groups' coordinators found
        wait_for(self._in_sync, timeout=START_TIMEOUT, interval=0.5,
                 what=f"kafka-{node} back in every partition's in-sync replicas")  # fmt: skip

    def _in_sync(self) -> bool:
        """Every replica of every partition, internal topics too, is in sync (from a
        Metadata v1 request for all topics)."""
        from kio.index import load_request_schema

        request_type: Any = load_request_schema(METADATA, 1)
        try:
            with ProbeConnection(self.bootstrap(), timeout=2, connect=self.connect) as probe:
                answer = probe.request(request_type(topics=None))
        except (OSError, ValueError):
            return False
        return all(set(p.isr_nodes) == set(p.replica_nodes)
                   for t in answer.topics for p in t.partitions)  # fmt: skip

    def stop(self) -> None:
        super().stop()
        if self.keycloak is not None:
            self.keycloak.stop()

    # -- the steps of start --------------------------------------------------------------------

    def _prepare(self) -> None:
        if self.keycloak is not None:  # it starts while the nodes are formatted
            self.keycloak.launch()
        super()._prepare()
        self.credentials = self._certificates()

    def _certificates(self) -> Credentials:
        pki = self.workdir / "pki"
        pki.mkdir(mode=0o700)
        cluster_ca = Authority(pki, "kafka cluster CA")
        clients_ca = Authority(pki, "kafka clients CA")
        for node in range(self.nodes):
            name = broker_host(node)
            cluster_ca.issue(f"broker-{node}", [name, name.removesuffix(".cluster.local")])
        bob = clients_ca.issue(MTLS_USER, [MTLS_USER], client=True)
        return Credentials(cluster_ca.pem, clients_ca.pem, SCRAM_USER, SCRAM_PASSWORD, bob)

    def _settings(self, node: int) -> dict[str, str]:
        assert self.credentials is not None
        voters = [broker_host(n) for n in range(self.nodes)]
        return broker_settings(
            node, voters, broker_address(node), self.workdir / f"node-{node}" / "data",
            self.workdir / "pki" / f"broker-{node}.pem", self.credentials.clients_ca,
            self.version, self.keycloak,
        )  # fmt: skip

    def _format_options(self) -> list[str]:
        """SCRAM users added at format time, as Kafka documents it."""
        users = [f"SCRAM-SHA-{bits}=[name={SCRAM_USER},password={SCRAM_PASSWORD}]"
                 for bits in (512, 256)]  # fmt: skip
        return [a for u in users for a in ("--add-scram", u)]

    def _before_launch(self) -> None:
        if self.keycloak is not None:  # a broker whose JWKS endpoint is down exits
            assert self.namespace is not None
            self.keycloak.wait_ready()
            self.keycloak.reachable_from(self.namespace)

    def _jvm_options(self) -> list[str]:
        oauth = [] if self.keycloak is None else self.keycloak.jvm_flags()
        return [*super()._jvm_options(), *oauth]

    def _serving(self, probe: ProbeConnection) -> bool:
        if self.offsets_topic:
            return super()._serving(probe)
        return len(probe.brokers()) >= self.nodes
