"""`up --service` and `--companions`: the services beside the brokers, from the flags to
the lines `up` prints (where each is served, and the client settings that use it)."""

from __future__ import annotations

from kafkatunnel.kube.companions import client_settings
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.service_forwarder import ServiceForwarder
from kafkatunnel.kube.services import ServiceRequest
from kafkatunnel.tunnel import Forwarder, Tunnel
from kafkatunnel.tunnel.companions import Companions


def companions_of(
    forwarder: Forwarder, requests: tuple[ServiceRequest, ...], discover: bool, listen_host: str
) -> Companions | None:
    """The services beside the brokers to serve (--service, --companions, checked with the
    other flags: see up_options.check), or None."""
    if not requests and not discover:
        return None
    assert isinstance(forwarder, KubectlForwarder)
    return Companions(ServiceForwarder(forwarder, list(requests), discover),
                      listen_host=listen_host)  # fmt: skip


# --read-only reads Kafka's protocol; a service's HTTP passes as it is (docs/security.md)
READ_ONLY_NOTE = (
    "warning: --read-only guards Kafka's protocol only: the services below are forwarded "
    "as they are, so their REST APIs can still change the cluster (POST /connectors, "
    "DELETE /subjects/NAME); leave out --companions/--service to keep them out of reach"
)


def companion_lines(tunnel: Tunnel) -> list[str]:
    """Each service beside the brokers: where it is served, and the client settings that
    use it (by its in-cluster name when the shim resolves it)."""
    if tunnel.companions is None:
        return []
    lines = [f"note: {note}" for note in tunnel.companions.notes]
    policy = tunnel.config.policy
    if policy is not None and policy.read_only and tunnel.companions.served:
        lines.append(READ_ONLY_NOTE)
    for companion in tunnel.companions.served:
        target, endpoint = companion.target, companion.endpoint
        where = f"{endpoint.local} -> svc/{target.name}.{target.namespace}:{target.port}"
        if endpoint.note is not None:
            where += f" ({endpoint.note})"
        elif companion.dns_address is not None:
            where += f" (name: {companion.dns_address}:{target.port})"
        lines.append(f"{target.kind or 'service'} {target.name}: {where}")
        url = companion.url(tunnel.dns is not None, tunnel.config.advertise)
        lines.extend(client_settings(target.kind, url))
        for audience in tunnel.config.audiences:  # containers on a bridge
            told = companion.url(False, audience.advertise)
            lines.extend(f"containers: {line}" for line in client_settings(target.kind, told))
        if target.kind == "keycloak" and not companion.names:
            lines.append(
                "note: tokens fetched there carry that address as their issuer, which "
                "brokers refuse: add --dns so they carry the in-cluster one"
            )
    return lines
