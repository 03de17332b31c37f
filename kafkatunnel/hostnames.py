"""What a host name handed to us by the network may be, and where it may resolve.

Brokers name themselves in Metadata answers, and the tunnel puts those names into commands
(--exec), files (/etc/hosts, /etc/resolver/<domain>) and DNS answers for the whole machine.
A broker is not the user: its names are checked here, in one place, before any of that.

- `check_host` / `check_address`: a name is an RFC 1123 host name (letters, digits and
  hyphens in labels of at most 63 characters, 253 in all) or an IP literal, and a port is in
  1-65535. Such a name needs no quoting in any shell, is one word of any command and one
  component of any path.
- `ClusterZones`: the zones the user's own names (the bootstrap, --broker, the Kubernetes
  cluster domain, --dns-zone) put under the tunnel's care. Only names inside them reach the
  machine's name resolution; others still work through their rewritten ports.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

MAX_NAME = 253  # RFC 1035 2.3.4, without the trailing dot
LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z", re.IGNORECASE)
DEFAULT_CLUSTER_DOMAIN = "cluster.local"
KUBERNETES_ZONES = ("svc",)  # `pod.service.namespace.svc`, as Strimzi advertises
NEVER_RESOLVED = ("localhost",)  # RFC 6761 6.3: always the machine itself


class UntrustedName(ValueError):
    """A name or port from the network that the tunnel will not use; says why."""


def check_host(host: str) -> str:
    """`host` unchanged if it is a host name or an IP literal, else UntrustedName."""
    if not host:
        raise UntrustedName("empty host name")
    shown = _shown(host)
    if is_ip_literal(host):
        return host
    name = host[:-1] if host.endswith(".") else host
    if len(name) > MAX_NAME:
        raise UntrustedName(f"host name of {len(name)} characters (at most {MAX_NAME})")
    for label in name.split("."):
        if not LABEL.match(label):
            raise UntrustedName(f"{shown} is not a host name (label {_shown(label)})")
    if name.replace(".", "").isdigit():
        raise UntrustedName(f"{shown} is neither an IP address nor a host name")
    return host


def check_port(port: int) -> int:
    if not 0 < port < 65536:
        raise UntrustedName(f"port {port} is not between 1 and 65535")
    return port


def check_address(host: str, port: int) -> tuple[str, int]:
    return check_host(host), check_port(port)


def is_ip_literal(host: str) -> bool:
    """An IPv4 or IPv6 address (without an IPv6 scope, which is free text)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return not (isinstance(address, ipaddress.IPv6Address) and address.scope_id)


def _shown(text: str, limit: int = 60) -> str:
    """A name as a log line may show it: quoted, escaped, cut (it may hold anything)."""
    cut = text if len(text) <= limit else text[:limit] + "..."
    return repr(cut)


def _normalize(name: str) -> str:
    return name.rstrip(".").lower()


def _within(name: str, zone: str) -> bool:
    return name == zone or name.endswith("." + zone)


def kubernetes_domain(host: str) -> str | None:
    """The cluster domain of a `pod.service.namespace.svc[.domain]` name ('' when it stops
    at svc), or None when `host` is not such a name."""
    labels = _normalize(host).split(".")
    if "svc" not in labels[3:]:
        return None
    return ".".join(labels[labels.index("svc", 3) + 1 :])


def derived_zone(host: str) -> str | None:
    """The zone a name the user gave stands for: a Kubernetes name's cluster domain, or the
    name's parent domain when that has two labels or more (a lone `com` or `kafka` would
    cover too much: name it with --dns-zone). None for IP literals and single labels."""
    if is_ip_literal(host):
        return None
    domain = kubernetes_domain(host)
    if domain is not None:
        return domain or None
    parent = _normalize(host).partition(".")[2]
    return parent if "." in parent else None


@dataclass(frozen=True)
class ClusterZones:
    """The zones whose names may reach the machine's resolution (hosts block, resolver
    files, resolved's routing domains, the shim's answers)."""

    zones: frozenset[str]

    @classmethod
    def of(
        cls,
        names: Iterable[str],
        extra: Iterable[str] = (),
        cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
    ) -> ClusterZones:
        """From the names the user gave (bootstrap, --broker), the cluster domain and the
        zones the user added. Every one is checked like a broker name."""
        zones = {_normalize(check_host(cluster_domain)), *KUBERNETES_ZONES}
        for name in names:
            zone = derived_zone(name)
            if zone is not None:
                zones.add(zone)
        for zone in extra:
            if is_ip_literal(zone):
                raise UntrustedName(f"{zone!r} is an address, not a DNS zone")
            zones.add(_normalize(check_host(zone)))
        return cls(frozenset(z for z in zones if not any(_within(z, n) for n in NEVER_RESOLVED)))

    def covers(self, host: str) -> bool:
        """Whether `host` (a checked name) may be resolved by the machine through us."""
        if is_ip_literal(host):
            return False
        name = _normalize(host)
        if any(_within(name, never) for never in NEVER_RESOLVED):
            return False
        return any(_within(name, zone) for zone in self.zones)

    def refusal(self, names: Iterable[str], domains: Iterable[str]) -> str | None:
        """Why this set of names and routing domains may not be handed to the machine's
        resolver (None: it may). A name must be inside the zones, or a short form the
        cluster's search path gives an inside name (`kafka-0.kafka-headless` for
        `kafka-0.kafka-headless.shop.svc.cluster.local`); a domain must be inside the zones
        or hold such a short form."""
        names = [_normalize(check_host(n)) for n in names]
        inside = [n for n in names if self.covers(n)]
        short = [n for n in names if n not in inside and any(f.startswith(n + ".") for f in inside)]
        for name in names:
            if name not in inside and name not in short:
                return f"{name!r} is outside the cluster's zones ({self})"
        for domain in (_normalize(check_host(d)) for d in domains):
            if not self.covers(domain) and not any(_within(s, domain) for s in short):
                return f"domain {domain!r} is outside the cluster's zones ({self})"
        return None

    def __str__(self) -> str:
        return ", ".join(sorted(self.zones))


OUTSIDE_ZONES = "not resolved: outside the cluster's zones"
