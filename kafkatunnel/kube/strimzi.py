"""What Strimzi's conventions give a TLS tunnel: the cluster CA and a KafkaUser's credentials
from their secrets, the brokers' TLS port and the names their certificates carry.

As Strimzi 0.4x documents them: the cluster CA certificate is `ca.crt` of the
`<cluster>-cluster-ca-cert` secret (during a CA renewal it holds both CAs); a KafkaUser's
secret has its name, with `user.crt` and `user.key` for `tls` authentication, and
`password` and `sasl.jaas.config` for `scram-sha-512`; broker pods carry the label
`strimzi.io/cluster`, name their TLS listener's container port `tcp-clientstls` (9093), and
each broker's certificate names `<pod>.<cluster>-kafka-brokers.<namespace>.svc`."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from kafkatunnel.hostnames import UntrustedName, check_host
from kafkatunnel.kube.kubectl import Kubectl, KubectlError
from kafkatunnel.kube.pods import Pod

CLUSTER_LABEL = "strimzi.io/cluster"
# A Kubernetes object name (RFC 1123 label): what a cluster's name must be before it is put
# into a secret's name, a kubectl argument and a broker name. The label comes from the
# cluster's answer, so it is checked, not trusted.
OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
TLS_PORT_NAME = "tcp-clientstls"


def cluster_of(pods: list[Pod]) -> str | None:
    """The Strimzi cluster the broker pods belong to (None: not Strimzi's pods, or a label
    that is no object name)."""
    names = {dict(p.labels).get(CLUSTER_LABEL) for p in pods} - {None}
    name = names.pop() if len(names) == 1 else None
    return name if name is not None and OBJECT_NAME.fullmatch(name) else None


def tls_port(pods: list[Pod]) -> int | None:
    return next((port for p in pods if (port := p.port_named(TLS_PORT_NAME))), None)


def broker_name(pod: Pod, cluster: str) -> str:
    """The name a broker's certificate carries and its TLS listener advertises."""
    return f"{pod.name}.{cluster}-kafka-brokers.{pod.namespace}.svc"


def ca_secret(cluster: str) -> str:
    return f"{cluster}-cluster-ca-cert"


@dataclass(frozen=True)
class UserCredentials:
    """A KafkaUser's credentials: a client certificate (tls) or a password (scram-sha-512)."""

    name: str
    secret: str
    namespace: str | None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    password: bytes | None = None

    @property
    def mechanism(self) -> str | None:
        return "SCRAM-SHA-512" if self.password is not None else None


async def read_secret(kubectl: Kubectl, name: str, purpose: str, fix: str) -> dict[str, bytes]:
    """The secret's data, decoded. Refused or missing: a KubectlError naming the secret,
    what it was for and the fix."""
    where = f" -n {kubectl.namespace}" if kubectl.namespace else ""
    try:
        secret = await kubectl.get_json("secret", name)
    except KubectlError as cause:
        reason = str(cause)
        if "RBAC forbids" in reason:
            reason = "reading secrets is not allowed (RBAC: get secrets)"
        raise KubectlError(
            f"cannot read secret {name}{where} ({purpose}): {reason}; {fix}",
            permanent=cause.permanent,
        ) from None
    data = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            data[str(key)] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            raise KubectlError(f"secret {name}{where}: {key} is not base64") from None
    return data


async def kafka_user(kubectl: Kubectl, name: str) -> UserCredentials:
    """A KafkaUser's credentials from its secret (named as the user)."""
    try:
        check_host(
            name
        )  # a Kubernetes object name is a DNS subdomain; nothing else reaches kubectl
    except UntrustedName:
        raise KubectlError(f"--kafka-user {name!r} is not a Kubernetes object name") from None
    where = f" -n {kubectl.namespace}" if kubectl.namespace else ""
    fix = (
        "give the credentials yourself: --tls-cert FILE --tls-key FILE for a tls user, "
        "the client's sasl.username and sasl.password for a scram-sha-512 user"
    )
    data = await read_secret(kubectl, name, f"KafkaUser {name}'s credentials", fix)
    if "user.crt" in data and "user.key" in data:
        return UserCredentials(name, name, kubectl.namespace, data["user.crt"], data["user.key"])
    if "password" in data:
        return UserCredentials(name, name, kubectl.namespace, password=data["password"])
    raise KubectlError(
        f"secret {name}{where} has neither user.crt/user.key nor password: is {name} a "
        f"KafkaUser with tls or scram-sha-512 authentication? ({fix})"
    )
