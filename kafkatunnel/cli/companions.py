"""`up --service` and `--companions`: the services beside the brokers, from the flags to
the lines `up` prints (where each is served, and the client settings that use it)."""

from __future__ import annotations

import typer

from kafkatunnel.kube.companions import client_settings
from kafkatunnel.kube.forwarder import KubectlForwarder
from kafkatunnel.kube.service_forwarder import ServiceForwarder
from kafkatunnel.kube.services import ServiceError, ServiceRequest
from kafkatunnel.tunnel import Forwarder, Tunnel
from kafkatunnel.tunnel.companions import Companions


def companions_of(
    forwarder: Forwarder, requests: list[str], discover: bool, listen_host: str
) -> Companions | None:
    """The services beside the brokers to serve (--service, --companions), or None."""
    if not requests and not discover:
        return None
    flag = "--service" if requests else "--companions"
    if not isinstance(forwarder, KubectlForwarder):
        raise typer.BadParameter("forwards Kubernetes services: add --via kubectl",
                                 param_hint=flag)  # fmt: skip
    parsed = []
    for request in requests:
        try:
            parsed.append(ServiceRequest.parse(request))
        except ServiceError as cause:
            raise typer.BadParameter(str(cause), param_hint="--service") from None
    names = [p.name for p in parsed]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise typer.BadParameter(f"service {twice[0]} is named twice", param_hint="--service")
    return Companions(ServiceForwarder(forwarder, parsed, discover), listen_host=listen_host)


def companion_lines(tunnel: Tunnel) -> list[str]:
    """Each service beside the brokers: where it is served, and the client settings that
    use it (by its in-cluster name when the shim resolves it)."""
    if tunnel.companions is None:
        return []
    lines = [f"note: {note}" for note in tunnel.companions.notes]
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
