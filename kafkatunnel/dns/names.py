"""The shim's names: which broker (or service) name resolves to which loopback address,
and where the zones it answers for begin and end. Which forms of a name may be here at all
is decided by kafkatunnel.hostnames.ClusterZones.names_of."""

from __future__ import annotations

import functools

from kafkatunnel.hostnames import ResolvableName, normalize


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

    def add(self, name: ResolvableName, address: str) -> None:
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
        known = self._suffixes
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
