"""Where a Kafka distribution on Kubernetes keeps the CA that signed its brokers'
certificates, so `up --tls` can trust it without --tls-ca.

As each documents it:
- Strimzi: `ca.crt` of `<cluster>-cluster-ca-cert` (see strimzi.py).
- Confluent for Kubernetes: with auto-generated certificates, the CA pair the user gives it
  as the `kubernetes.io/tls` secret `ca-pair-sslcerts` (`tls.crt`); with certificates of
  one's own, `cacerts.pem` of the secret the Kafka resource's `tls.secretRef` names, which
  the broker pods mount.
- Bitnami's chart: `ca.crt` of `<fullname>-tls` (or `tls.existingSecret`), a
  `kubernetes.io/tls` secret the broker pods mount; cert-manager's secrets have the same
  shape.
A secret's name comes from the pods (the cluster's answer): it is used only when it is a
Kubernetes object name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kafkatunnel.kube import strimzi
from kafkatunnel.kube.kubectl import Kubectl, KubectlError
from kafkatunnel.kube.pods import Pod

# A secret's name: a DNS-1123 subdomain (Kubernetes' validation.IsDNS1123Subdomain).
SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
CFK_CA_PAIR = "ca-pair-sslcerts"
PEM = b"-----BEGIN CERTIFICATE-----"


@dataclass(frozen=True)
class CaSource:
    """A secret that may hold the CA, the key it would be under, and whose convention."""

    secret: str
    key: str
    convention: str


def sources(pods: list[Pod]) -> list[CaSource]:
    """Where the broker pods' CA may be, most specific first."""
    cluster = strimzi.cluster_of(pods)
    if cluster is not None:
        return [CaSource(strimzi.ca_secret(cluster), "ca.crt", f"Strimzi cluster {cluster}")]
    mounted = sorted({s for pod in pods for s in pod.secrets if SECRET_NAME.match(s)})
    if any(dict(p.labels).get("platform.confluent.io/type") == "kafka" for p in pods):
        found = [CaSource(CFK_CA_PAIR, "tls.crt", "Confluent for Kubernetes' CA pair")]
        return found + [CaSource(s, "cacerts.pem", "Confluent for Kubernetes") for s in mounted]
    return [CaSource(s, "ca.crt", "the secret the broker pods mount") for s in mounted]


async def find(kubectl: Kubectl, pods: list[Pod]) -> tuple[bytes, CaSource] | None:
    """The first CA (PEM) found in the sources; None when no source holds one. A source
    that may not be read (RBAC) stops the search with a KubectlError naming the secret and
    --tls-ca: guessing on without it would trust less than the user expects."""
    where = f" -n {kubectl.namespace}" if kubectl.namespace else ""
    for source in sources(pods):
        escaped = source.key.replace(".", "\\.")  # jsonpath: ca\.crt
        fix = (
            f"give it with --tls-ca FILE (someone who may: kubectl get secret {source.secret}"
            f"{where} -o jsonpath='{{.data.{escaped}}}' | base64 -d > ca.pem)"
        )
        try:
            data = await strimzi.read_secret(kubectl, source.secret, "the cluster CA, for --tls",
                                             fix)  # fmt: skip
        except KubectlError as cause:
            if "not found" in str(cause) and not cause.permanent:
                continue
            raise
        if PEM in data.get(source.key, b""):
            return data[source.key], source
    return None
