"""What a host name handed to us by the network may be, and where it may resolve.

Brokers name themselves in Metadata answers, and the tunnel puts those names into commands
(--exec), files (/etc/hosts, /etc/resolver/<domain>) and DNS answers for the whole machine.
A broker is not the user: its names are checked here, in one place, before any of that.

- `check_host` / `check_address`: a name is an RFC 1123 host name (letters, digits and
  hyphens in labels of at most 63 characters, 253 in all) or an IP literal, and a port is in
  1-65535 (`parse_port`, from text: in ASCII digits). Such a name needs no quoting in any
  shell, is one word of any command and one component of any path.
- `ClusterZones`: the zones the user's own names (the bootstrap, --broker, the Kubernetes
  cluster domain, --dns-zone) put under the tunnel's care. Only names inside them reach the
  machine's name resolution; others still work through their rewritten ports.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from publicsuffixlist import PublicSuffixList

MAX_NAME = 253  # RFC 1035 2.3.4, without the trailing dot
LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z", re.IGNORECASE)
DEFAULT_CLUSTER_DOMAIN = "cluster.local"
KUBERNETES_ZONES = ("svc",)  # `pod.service.namespace.svc`, as Strimzi advertises
NEVER_RESOLVED = ("localhost",)  # RFC 6761 6.3: always the machine itself
MULTICAST_DNS = "local"  # RFC 6762: multicast DNS's, never a zone (`cluster.local` may be)


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


def parse_port(text: str) -> int:
    """A port written as text (a flag's, a recording's): ASCII digits, 1-65535, else
    UntrustedName. str.isdigit() is no test: it passes superscripts, which int() refuses,
    and int() reads Arabic-Indic and fullwidth digits, which no one means as a port."""
    if not (text.isascii() and text.isdigit()):
        raise UntrustedName(f"port {_shown(text)} is not a number between 1 and 65535")
    return check_port(int(text))


def split_address(address: str, default_port: int | None = None) -> tuple[str, int]:
    """HOST:PORT as (host, port), else ValueError saying why. An IPv6 host goes in brackets
    ([::1]:9092), and only it: `::1:9092` could be ::1 port 9092 or the address ::1:9092,
    and a bracket left open is a typo, never a host. With default_port, the port may be
    left out (HOST, [::1]), as in a URL."""
    if address.startswith("["):
        host, closed, rest = address[1:].partition("]")
        if not closed:
            raise ValueError(f"{address!r} opens a bracket it does not close: an IPv6 host "
                             "goes in brackets, e.g. [::1]:9092")  # fmt: skip
        if "[" in host or "[" in rest or "]" in rest:
            raise ValueError(f"{address!r} has brackets that do not pair: an IPv6 host goes "
                             "in brackets, e.g. [::1]:9092")  # fmt: skip
        if host and ":" not in host:
            raise ValueError(f"{address!r} is not HOST:PORT: brackets hold an IPv6 address, "
                             f"not {host!r}")  # fmt: skip
        if not rest and default_port is not None:
            return _checked_host(address, host), default_port
        if not rest.startswith(":"):
            raise ValueError(f"{address!r} is not HOST:PORT: a port goes after the ']'")
        port = rest[1:]
    elif "[" in address or "]" in address:
        raise ValueError(f"{address!r} has brackets that do not pair: an IPv6 host goes in "
                         "brackets, e.g. [::1]:9092")  # fmt: skip
    else:
        host, sep, port = address.rpartition(":")
        if ":" in host:
            raise ValueError(_bare_ipv6(address, host, port))
        if not sep and default_port is not None:
            return _checked_host(address, address), default_port
        if not sep:
            raise ValueError(f"{address!r} is not HOST:PORT")
    _checked_host(address, host)
    try:
        return host, parse_port(port)
    except ValueError as cause:
        raise ValueError(f"{address!r} is not HOST:PORT: {cause}") from None


def _checked_host(address: str, host: str) -> str:
    if not host:
        raise ValueError(f"{address!r} is not HOST:PORT: the host is missing")
    return host


def _bare_ipv6(address: str, host: str, port: str) -> str:
    """Why an unbracketed IPv6 address is refused, and how to write it."""
    if is_ip_literal(host) and port.isascii() and port.isdigit():
        return f"{address!r}: an IPv6 host goes in brackets: write [{host}]:{port}"
    if is_ip_literal(address):
        return f"{address!r} has no port: write an IPv6 host with its port as [{address}]:PORT"
    return f"{address!r} is not HOST:PORT: an IPv6 host goes in brackets, e.g. [::1]:9092"


def join_address(host: str, port: int) -> str:
    """HOST:PORT as split_address reads it back (and clients expect): an IPv6 host in
    brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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


def normalize(name: str) -> str:
    """Lower case, no trailing dot: DNS names compare case-insensitively."""
    return name.rstrip(".").lower()


def _within(name: str, zone: str) -> bool:
    return name == zone or name.endswith("." + zone)


@functools.cache
def _public_suffixes() -> PublicSuffixList:
    return PublicSuffixList()  # the list the package ships: ICANN and private sections


def public_suffix(name: str) -> str | None:
    """The public suffix `name` lies under (`com` for `kafka-3.github.com`, `co.uk`, `shop`),
    or None when no rule of the Public Suffix List holds it (`cluster.local`, `svc`,
    `kafka-headless`): such a name cannot be anybody's name on the internet."""
    return _public_suffixes().publicsuffix(normalize(name), accept_unknown=False)


def is_public_suffix(name: str) -> bool:
    """`com`, `co.uk`, `github.io`: a suffix under which the public register names."""
    return public_suffix(name) == normalize(name)


@dataclass(frozen=True)
class KubernetesName:
    """A name Kubernetes DNS gives: a service's `service.namespace.svc[.domain]`, or a pod's
    behind a headless service, `pod.service.namespace.svc[.domain]`. `domain` is '' when
    the name stops at `svc`, as Strimzi advertises."""

    pod: str | None
    service: str
    namespace: str
    domain: str


def kubernetes_name(host: str) -> KubernetesName | None:
    """The parts of a Kubernetes name, or None when `host` is not one: `svc` must follow
    exactly two labels (a service) or three (a pod); `a.b.c.d.svc` is some other name."""
    labels = normalize(host).split(".")
    at = labels.index("svc") if "svc" in labels else -1
    if at == 2:
        return KubernetesName(None, labels[0], labels[1], ".".join(labels[3:]))
    if at == 3:
        return KubernetesName(labels[0], labels[1], labels[2], ".".join(labels[4:]))
    return None


def derived_zone(host: str) -> str | None:
    """The zone a name the user gave stands for: a Kubernetes name's cluster domain, or the
    name's parent domain, when that has two labels or more and is no public suffix (a lone
    `com`, `kafka` or `local`, or `co.uk`, would cover too much: name it with --dns-zone).
    None for IP literals and single labels. A Kubernetes name whose cluster domain is a
    public suffix (`kafka.shop.svc.com`) is a public name, no cluster's: UntrustedName."""
    if is_ip_literal(host):
        return None
    name = kubernetes_name(host)
    if name is not None and is_public_suffix(name.domain):
        raise UntrustedName(
            f"{_shown(host)} is shaped like a Kubernetes name, but its cluster domain "
            f"{name.domain!r} is a public suffix: give the broker's address or a name of the "
            "cluster's own"
        )
    zone = name.domain if name is not None else normalize(host).partition(".")[2]
    return zone if "." in zone and not is_public_suffix(zone) else None


@dataclass(frozen=True)
class ResolvableName:
    """One advertised name and every form of it that may resolve, with the domains under
    which the shim answers for them (unknown names there are NXDOMAIN)."""

    advertised: str
    forms: frozenset[str]
    suffixes: frozenset[str]


@dataclass(frozen=True)
class ClusterZones:
    """The zones whose names may reach the machine's resolution (hosts block, resolver
    files, resolved's routing domains, the shim's answers), and the one place that says
    which forms of a name do.

    A name inside the zones resolves. The short forms a pod's search path gives
    (`pod.service`, `pod.service.namespace`; `service`, `service.namespace`) resolve only
    for the namespaces the user named (--namespace, or in a name they gave), and never
    when a public suffix holds them: `kafka-3.github.com.svc` must not make `github.com` or
    `kafka-3.github.com` resolve here. No zone and no routing domain is a public suffix.

    The shim answers for, and the resolver routes to it, only domains inside the zones: a
    domain outside them would take every other name under it too (NXDOMAIN for
    `intranet.mycorp.lan` once a broker named `team.mycorp.lan` made `mycorp.lan` one).
    Short forms outside the zones are names, never domains: /etc/hosts holds them."""

    zones: frozenset[str]
    namespaces: frozenset[str] = frozenset()
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN

    @classmethod
    def of(
        cls,
        names: Iterable[str],
        extra: Iterable[str] = (),
        cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
        namespaces: Iterable[str] = (),
    ) -> ClusterZones:
        """From the names the user gave (bootstrap, --broker), the cluster domain, the zones
        and namespaces the user added. Every one is checked like a broker name."""
        domain = normalize(check_host(cluster_domain))
        if is_public_suffix(domain):
            raise UntrustedName(f"{domain!r} is a public suffix, not a cluster domain")
        if domain == MULTICAST_DNS:
            raise UntrustedName(f"{domain!r} is multicast DNS's (RFC 6762), not a cluster domain")
        zones = {domain, *KUBERNETES_ZONES}
        spaces = {normalize(check_host(n)) for n in namespaces}
        for name in names:
            zone = derived_zone(name)
            if zone is not None:
                zones.add(zone)
            parsed = None if is_ip_literal(name) else kubernetes_name(name)
            if parsed is not None:
                spaces.add(parsed.namespace)
        for zone in extra:
            if is_ip_literal(zone):
                raise UntrustedName(f"{zone!r} is an address, not a DNS zone")
            if is_public_suffix(zone):
                raise UntrustedName(f"{zone!r} is a public suffix: name a zone of your own")
            if normalize(zone) == MULTICAST_DNS:
                raise UntrustedName(f"{zone!r} is multicast DNS's (RFC 6762): name a zone of "
                                    "your own")  # fmt: skip
            zones.add(normalize(check_host(zone)))
        kept = frozenset(z for z in zones if not any(_within(z, n) for n in NEVER_RESOLVED))
        return cls(kept, frozenset(spaces), domain)

    def covers(self, host: str) -> bool:
        """Whether `host` (a checked name) may be resolved by the machine through us."""
        if is_ip_literal(host):
            return False
        name = normalize(host)
        if any(_within(name, never) for never in NEVER_RESOLVED):
            return False
        return any(_within(name, zone) for zone in self.zones)

    def allows(self, name: str) -> bool:
        """Whether a form or a domain may reach the resolver: inside the zones, or held by
        no public suffix (and never `localhost`)."""
        if any(_within(name, never) for never in NEVER_RESOLVED):
            return False
        return self.covers(name) or public_suffix(name) is None

    def names_of(self, advertised: str) -> ResolvableName:
        """The forms of a broker's (or a service's) advertised name that may resolve, and
        the domains the shim then answers for; the caller checked that the name is
        covered. A name outside Kubernetes is found under its parent domain, or, when that
        is no domain of ours (the name is a zone's apex), under itself."""
        host = normalize(advertised)
        parsed = kubernetes_name(host)
        if parsed is None:
            parent = host.partition(".")[2]
            return self._kept(host, {host}, {parent if self._is_domain(parent) else host})
        pod, service, namespace = parsed.pod, parsed.service, parsed.namespace
        domain = parsed.domain or self.cluster_domain
        svc = f"{service}.{namespace}.svc"
        own = f"{pod}." if pod else ""
        forms = {host, f"{own}{svc}", f"{own}{svc}.{domain}"}
        suffixes = {f"{namespace}.svc", "svc", f"svc.{domain}", domain}
        if namespace in self.namespaces:  # the search path's short forms, and their domains
            in_namespace = f"{service}.{namespace}"
            if pod:
                forms |= {f"{own}{in_namespace}", f"{own}{service}"}
                suffixes |= {in_namespace, service}
            else:
                forms |= {in_namespace, service}
                suffixes |= {namespace, service}
        return self._kept(host, forms, suffixes)

    def _kept(self, host: str, forms: set[str], suffixes: set[str]) -> ResolvableName:
        return ResolvableName(
            host,
            frozenset(f for f in forms if self.allows(f)),
            frozenset(s for s in suffixes if self._is_domain(s)),
        )

    def _is_domain(self, name: str) -> bool:
        """Whether the shim may answer for everything under `name` (and a resolver route
        it there): inside the zones, and no public suffix."""
        return self.covers(name) and not is_public_suffix(name)

    def service_names(self, service: str, namespace: str) -> ResolvableName:
        """A Kubernetes service's names, as pods reach it through their search path: `NAME`,
        `NAME.NS` (for the user's namespaces), `NAME.NS.svc` and the full name."""
        full = f"{normalize(service)}.{normalize(namespace)}.svc.{self.cluster_domain}"
        return self.names_of(full)

    def refusal(self, names: Iterable[str], domains: Iterable[str]) -> str | None:
        """Why this set of names and routing domains may not be handed to the machine's
        resolver (None: it may). Every name must be a form `names_of` gives a name inside
        the zones, every domain inside the zones and no public suffix: what the tunnel
        itself hands over, and nothing a broker could add."""
        names = [normalize(check_host(n)) for n in names]
        granted = [self.names_of(n) for n in names if self.covers(n)]
        forms = {f for g in granted for f in g.forms}
        for name in names:
            if name not in forms:
                return f"{name!r} is outside the cluster's zones ({self})"
        for domain in (normalize(check_host(d)) for d in domains):
            if not self._is_domain(domain):
                return f"domain {domain!r} is outside the cluster's zones ({self})"
        return None

    def __str__(self) -> str:
        return ", ".join(sorted(self.zones))


OUTSIDE_ZONES = "not resolved: outside the cluster's zones"
