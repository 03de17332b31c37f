"""The names a Kubernetes broker answers to, and where the cluster's zone begins and ends.

A pod behind a headless service is `pod.service.namespace.svc.<cluster domain>`; inside the
cluster the search path also resolves `pod.service`, `pod.service.namespace` and
`pod.service.namespace.svc`. Strimzi advertises `...svc` without the cluster domain.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

DEFAULT_CLUSTER_DOMAIN = "cluster.local"


def normalize(name: str) -> str:
    """Lower case, no trailing dot: DNS names compare case-insensitively."""
    return name.rstrip(".").lower()


@dataclass(frozen=True)
class BrokerName:
    """One broker's advertised name and every form of it that should resolve."""

    advertised: str
    forms: frozenset[str]
    suffixes: frozenset[str]  # the service-level names under which unknown names are NXDOMAIN


def broker_name(advertised: str, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN) -> BrokerName:
    host = normalize(advertised)
    labels = host.split(".")
    if "svc" in labels[2:]:
        svc = labels.index("svc", 2)
        pod, service, namespace = labels[0], labels[1], labels[2]
        domain = ".".join(labels[svc + 1 :]) or cluster_domain
        full = f"{pod}.{service}.{namespace}.svc.{domain}"
        forms = {
            f"{pod}.{service}",
            f"{pod}.{service}.{namespace}",
            f"{pod}.{service}.{namespace}.svc",
            full,
            host,
        }
        suffixes = {
            f"{service}",
            f"{service}.{namespace}",
            f"{service}.{namespace}.svc",
            f"{namespace}.svc",
            "svc",
            f"svc.{domain}",
            domain,
        }
        return BrokerName(host, frozenset(forms), frozenset(suffixes))
    parent = ".".join(labels[1:]) or host
    return BrokerName(host, frozenset({host}), frozenset({parent}))


def service_name(
    service: str, namespace: str, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
) -> BrokerName:
    """A Kubernetes service's names, as pods reach it through their search path: `NAME`,
    `NAME.NS`, `NAME.NS.svc` and `NAME.NS.svc.<cluster domain>`."""
    name, ns, domain = normalize(service), normalize(namespace), normalize(cluster_domain)
    full = f"{name}.{ns}.svc.{domain}"
    forms = {name, f"{name}.{ns}", f"{name}.{ns}.svc", full}
    suffixes = {f"{ns}.svc", "svc", f"svc.{domain}", domain}
    return BrokerName(full, frozenset(forms), frozenset(suffixes))


class Zone:
    """Name -> IPv4 address for the brokers, and the zones the shim is authoritative for.

    Its apexes are the outermost suffixes of the brokers' names (`cluster.local`, `svc`, the
    headless service's short name): inside them a name exists when it is a broker name, an
    apex, or an empty non-terminal between the two (`demo.svc.cluster.local`), and nothing
    else does. Outside them the shim has no say."""

    def __init__(self) -> None:
        self._addresses: dict[str, str] = {}
        self._suffixes: set[str] = set()
        self.serial = 0  # grows with every change, for the zones' SOA

    def add(self, name: BrokerName, address: str) -> None:
        for form in name.forms:
            self._addresses[form] = address
        self._suffixes |= name.suffixes
        self.serial += 1
        self.__dict__.pop("apexes", None)
        self.__dict__.pop("_existing", None)

    def lookup(self, name: str) -> str | None:
        return self._addresses.get(normalize(name))

    def apex_of(self, name: str) -> str | None:
        """The apex of the zone `name` is in (the closest enclosing one), or None."""
        key = normalize(name)
        enclosing = [a for a in self.apexes if key == a or key.endswith("." + a)]
        return max(enclosing, key=len, default=None)

    def exists(self, name: str) -> bool:
        """Whether `name` has records or names below it (else, in a zone, NXDOMAIN)."""
        return normalize(name) in self._existing

    @functools.cached_property
    def apexes(self) -> frozenset[str]:
        known = self._suffixes | {".".join(n.split(".")[1:]) or n for n in self._addresses}
        return frozenset(s for s in known if not any(s.endswith("." + o) for o in known))

    @functools.cached_property
    def _existing(self) -> frozenset[str]:
        found = set(self.apexes)
        for name in self._addresses:
            labels = name.split(".")
            for start in range(len(labels)):
                ancestor = ".".join(labels[start:])
                if any(ancestor == a or ancestor.endswith("." + a) for a in self.apexes):
                    found.add(ancestor)
        return frozenset(found)

    @property
    def names(self) -> dict[str, str]:
        return dict(self._addresses)

    @property
    def domains(self) -> list[str]:
        """The most specific domains to route to the shim (for resolver set-up)."""
        dotted = [s for s in self._suffixes if "." in s]
        return sorted(s for s in dotted if not any(s.endswith("." + o) for o in dotted))
