"""Which broker is behind each server address a capture's connections went to.

A kafkatunnel recording says it in each listener's description. A plain capture (tcpdump on
a laptop whose clients reach the cluster through port-forwards or other relays) does not:
the brokers advertise `kafka-1.kafka-headless.shop.svc.cluster.local:9092` while the
connections go to `127.0.0.3:9092`. The evidence, strongest first:

- recording: our own listener description;
- advertised: the address is one a Metadata, DescribeCluster or FindCoordinator answer gave;
- dns: a DNS answer inside the capture maps the broker's advertised name to the address;
- behaviour: on a connection to the address, coordinator-scoped requests for keys that
  broker N coordinates (per the FindCoordinator answer in force) were answered without a
  coordinator error, or Produce, Fetch and ListOffsets requests for partitions that N
  leads (per the Metadata answer in force) were served: broker N is there.
  NOT_COORDINATOR and NOT_LEADER_OR_FOLLOWER say who is not;
- user: `--broker ADDRESS=NODE`, which wins over everything.

Behaviour is what the address did: when it answers as a broker other than the one a weaker
kind of evidence names (one relay for every advertised address), it wins, and the
identification says so. An address whose connections answer as different brokers (a load
balancer, a relay that alternates, a forward that moved) is ambiguous: each connection is
then judged as the broker it answered as, and one that never showed is not judged.

Pure functions over small tuples, so Spark can compute sightings per group anywhere.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kafkatunnel.protocol import COORDINATOR_ERRORS, NOT_COORDINATOR
from kafkatunnel.verify.events import CALL, LOOKUP, PARTITION
from kafkatunnel.verify.partitions import NOT_LEADER_OR_FOLLOWER
from kafkatunnel.verify.resolutions import DnsAnswer

USER, RECORDING, ADVERTISED, DNS, BEHAVIOUR = "user", "recording", "advertised", "dns", "behaviour"
METHODS = (USER, RECORDING, ADVERTISED, DNS, BEHAVIOUR)  # strongest first
COORDINATOR, LEADER = "coordinator", "leader"  # what a piece of behaviour was about
REFUSALS = {
    COORDINATOR: "NOT_COORDINATOR for keys {} coordinates",
    LEADER: "NOT_LEADER_OR_FOLLOWER for partitions {} leads",
}


class Sighting(NamedTuple):
    """What one connection's answers for one key said about one broker: answered (the
    broker coordinates the group, or leads the partition: it is there) or denied
    (NOT_COORDINATOR, NOT_LEADER_OR_FOLLOWER: it is not)."""

    conn: str  # the connection's key
    server: str
    ts: int  # the first such answer
    node: int  # the coordinator FindCoordinator (the leader Metadata) named for the key then
    answered: int
    denied: int
    about: str = COORDINATOR  # or LEADER


@dataclass
class Identity:
    address: str
    node: int | None
    method: str | None  # None: not identified
    evidence: dict[str, int] = field(default_factory=dict)  # method -> pieces seen
    behaviour: dict[str, int] = field(default_factory=dict)  # about -> answers as its node
    changes: list[tuple[int, int | None]] = field(default_factory=list)  # ambiguous: (ts, node)
    note: str | None = None

    @property
    def ambiguous(self) -> bool:
        return len({node for _, node in self.changes}) > 1

    def as_dict(self, start: int = 0) -> dict[str, Any]:
        changes = self.changes if self.ambiguous else []
        return {
            "address": self.address,
            "node": self.node,
            "method": self.method,
            "evidence": self.evidence,
            "behaviour": self.behaviour,
            "ambiguous": self.ambiguous,
            "changes": [{"t_ms": round((ts - start) / 1e6, 3), "node": n} for ts, n in changes],
            "note": self.note,
        }


@dataclass
class Identities:
    """Every server address's identification, and, for ambiguous ones, each connection's."""

    addresses: dict[str, Identity] = field(default_factory=dict)
    connections: dict[str, int] = field(default_factory=dict)  # conn key -> node it showed

    def told(self, server: str) -> bool:
        """Whether the broker behind an address is known, not inferred: the user said it
        (`--broker`) or a recording's listener did."""
        identity = self.addresses.get(_normal(server))
        return identity is not None and identity.method in (USER, RECORDING)

    def node_of(self, conn_key: str, server: str) -> int | None:
        identity = self.addresses.get(_normal(server))
        if identity is None:
            return None
        if identity.ambiguous:
            return self.connections.get(conn_key)
        return identity.node


def sightings_of(events: Iterable[Any]) -> list[Sighting]:
    """One key's events (LOOKUP and CALL, any order) -> per connection and named node, how
    often the answers were the named broker's and how often they denied being it."""
    named: int | None = None
    about = COORDINATOR
    found: dict[tuple[str, int], _Seen] = {}
    for event in sorted(events, key=lambda e: (e.ts, e.kind != LOOKUP)):
        if event.kind == LOOKUP:
            if event.error == 0 and event.node is not None and event.node >= 0:
                named = event.node
            continue
        if event.kind != CALL or named is None or event.error is None:
            continue
        if event.conn.node is not None:
            continue  # a recording's listener says it already
        if event.key_type == PARTITION:
            about = LEADER
            answered, denied = event.error == 0, event.error == NOT_LEADER_OR_FOLLOWER
        else:
            answered = event.error not in COORDINATOR_ERRORS
            denied = event.error == NOT_COORDINATOR
        if not (answered or denied):
            continue
        seen = found.setdefault((event.conn.key, named), _Seen(event.conn.server, event.ts))
        seen.answered += answered
        seen.denied += denied
    return [Sighting(conn, seen.server, seen.ts, node, seen.answered, seen.denied, about)
            for (conn, node), seen in found.items()]  # fmt: skip


@dataclass
class _Seen:
    """A connection's answers about one named broker: where, since when, how many."""

    server: str
    ts: int
    answered: int = 0
    denied: int = 0


def resolved(answers: Iterable[DnsAnswer]) -> dict[str, set[str]]:
    """name -> every address its answers (following CNAME chains) gave."""
    direct: dict[str, set[str]] = {}
    aliases: dict[str, set[str]] = {}
    for answer in answers:
        if _is_ip(answer.address):
            direct.setdefault(answer.name, set()).add(answer.address)
        else:
            aliases.setdefault(answer.name, set()).add(answer.address)
    out: dict[str, set[str]] = {}
    for name in set(direct) | set(aliases):
        seen, todo, found = {name}, [name], set()
        while todo:
            current = todo.pop()
            found |= direct.get(current, set())
            for target in aliases.get(current, ()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        out[name] = found
    return out


def identify(
    servers: Iterable[str],
    *,
    recorded: Mapping[str, int] | None = None,
    advertised: Iterable[tuple[int, str]] = (),
    dns: Iterable[DnsAnswer] = (),
    sightings: Iterable[Sighting] = (),
    user: Mapping[str, int] | None = None,
) -> Identities:
    """Each server address's broker, from the strongest evidence there is."""
    sightings = list(sightings)
    adverts: dict[str, set[int]] = {}
    for node, address in advertised:
        adverts.setdefault(_normal(address), set()).add(node)
    names = resolved(dns)
    by_dns: dict[str, set[int]] = {}
    for address, nodes in adverts.items():
        host, _, port = address.rpartition(":")
        if _is_ip(host):
            continue
        for ip in names.get(host.lower().rstrip("."), ()):
            by_dns.setdefault(_normal(f"{ip}:{port}"), set()).update(nodes)
    shown = _shown_by_connection(sightings)
    recorded = {_normal(a): n for a, n in (recorded or {}).items()}
    user = {_normal(a): n for a, n in (user or {}).items()}
    out = Identities()
    every = ({_normal(s) for s in servers} | {_normal(s.server) for s in sightings}
             | set(user))  # fmt: skip
    for server in sorted(every):
        identity = _identify_one(
            server, recorded.get(server), adverts.get(server, set()),
            by_dns.get(server, set()), shown.get(server, []), user.get(server),
        )  # fmt: skip
        _note_refusals(identity, shown.get(server, []))
        out.addresses[server] = identity
        if identity.ambiguous:
            for conn, (_ts, node) in _connections(shown.get(server, [])).items():
                out.connections[conn] = node
    return out


class Shown(NamedTuple):
    """What one connection showed of one broker (sorted by when it was first seen)."""

    ts: int  # first seen
    conn: str
    node: int
    answered: bool  # answered as that broker (else: denied being it)
    abouts: tuple[str, ...]  # what the answers were about: coordinator, leader


def _shown_by_connection(sightings: Iterable[Sighting]) -> dict[str, list[Shown]]:
    """server -> what each connection showed: answered as exactly one named broker (and no
    denial from it), or denied being a broker it never answered as."""
    answered: dict[tuple[str, str], dict[int, tuple[int, set[str]]]] = {}
    denied: dict[tuple[str, str], dict[int, tuple[int, set[str]]]] = {}
    for s in sightings:
        key = (_normal(s.server), s.conn)
        for seen, count in ((answered, s.answered), (denied, s.denied)):
            if count:
                nodes = seen.setdefault(key, {})
                ts, abouts = nodes.get(s.node, (s.ts, set()))
                abouts.add(s.about)
                nodes[s.node] = (min(ts, s.ts), abouts)
    out: dict[str, list[Shown]] = {}
    for (server, conn), nodes in answered.items():
        clean = {n: seen for n, seen in nodes.items() if n not in denied.get((server, conn), {})}
        if len(clean) == 1:
            ((node, (ts, abouts)),) = clean.items()
            out.setdefault(server, []).append(Shown(ts, conn, node, True, tuple(sorted(abouts))))
    for (server, conn), nodes in denied.items():
        for node, (ts, abouts) in nodes.items():
            if node not in answered.get((server, conn), {}):
                denial = Shown(ts, conn, node, False, tuple(sorted(abouts)))
                out.setdefault(server, []).append(denial)
    for each in out.values():
        each.sort()
    return out


def _connections(shown: list[Shown]) -> dict[str, tuple[int, int]]:
    return {s.conn: (s.ts, s.node) for s in shown if s.answered}


def _identify_one(
    server: str,
    recorded: int | None,
    adverts: set[int],
    by_dns: set[int],
    shown: list[Shown],
    user: int | None,
) -> Identity:
    identity = Identity(server, None, None)
    if recorded is not None:
        identity.evidence[RECORDING] = 1
    if adverts:
        identity.evidence[ADVERTISED] = len(adverts)
    if by_dns:
        identity.evidence[DNS] = len(by_dns)
    behaviour = {s.node for s in shown if s.answered}
    if behaviour:
        identity.evidence[BEHAVIOUR] = sum(s.answered for s in shown)
        for s in shown:
            for about in s.abouts if s.answered else ():
                identity.behaviour[about] = identity.behaviour.get(about, 0) + 1
    denials = [(s.ts, s.node) for s in shown if not s.answered and s.node in behaviour]
    if user is not None:
        identity.node, identity.method = user, USER
        return identity
    if recorded is not None:
        identity.node, identity.method = recorded, RECORDING
        return identity
    if len(behaviour) > 1 or denials:
        identity.method = BEHAVIOUR
        identity.changes = _changes(shown, behaviour)
        brokers = " and ".join(f"broker {n}" for n in sorted(behaviour))
        other = (
            " and as another broker (refusing requests meant for one it answered as)"
            if denials
            else ""
        )
        identity.note = (
            f"answers as {brokers}{other} on different connections (a load balancer, a relay "
            "to several brokers, or a forward that moved); each connection is judged as the "
            "broker it answered as"
        )
        return identity
    for method, nodes in ((ADVERTISED, adverts), (DNS, by_dns)):
        if len(nodes) == 1:
            (node,) = nodes
            if behaviour and behaviour != {node}:
                (seen,) = behaviour
                identity.node, identity.method = seen, BEHAVIOUR
                identity.note = (f"{method} evidence says broker {node}, but it answers as "
                                 f"broker {seen}")  # fmt: skip
                return identity
            identity.node, identity.method = node, method
            return identity
        if len(nodes) > 1 and not behaviour:
            identity.note = (f"{method} evidence names brokers "
                             f"{', '.join(map(str, sorted(nodes)))}")  # fmt: skip
    if behaviour:
        (identity.node,) = behaviour
        identity.method = BEHAVIOUR
    return identity


def _note_refusals(identity: Identity, shown: list[Shown]) -> None:
    """Say which brokers the address is not: NOT_COORDINATOR for keys they coordinate, or
    NOT_LEADER_OR_FOLLOWER for partitions they lead, on connections that never answered as
    them (the single port-forward failure's mark)."""
    if identity.ambiguous or identity.method == USER:
        return
    refused: dict[str, set[int]] = {}
    for s in shown:
        for about in s.abouts if not s.answered else ():
            refused.setdefault(about, set()).add(s.node)
    if not refused:
        return
    said = []
    for about in (COORDINATOR, LEADER):
        if about in refused:
            which = ", ".join(f"broker {n}" for n in sorted(refused[about]))
            said.append(REFUSALS[about].format(which))
    text = "answered " + " and ".join(said)
    if any(identity.node in nodes for nodes in refused.values()):
        text += f": it does not lead to broker {identity.node}"
    identity.note = f"{identity.note}; {text}" if identity.note else text


def _changes(shown: list[Shown], behaviour: set[int]) -> list[tuple[int, int | None]]:
    """(ts, node) each time the broker an address answered as changed (None: a broker that
    denied being one it answered as elsewhere)."""
    out: list[tuple[int, int | None]] = []
    for s in shown:
        if not s.answered and s.node not in behaviour:
            continue
        now = s.node if s.answered else None
        if not out or out[-1][1] != now:
            out.append((s.ts, now))
    return out


def parse_broker_entries(entries: Iterable[str]) -> dict[str, int]:
    """`--broker ADDRESS=NODE` entries as address -> node; ValueError names a bad one."""
    out: dict[str, int] = {}
    for entry in entries:
        address, sep, node = entry.rpartition("=")
        host, colon, port = address.rpartition(":")
        if not sep or not colon or not host or not _digits(port) or not _digits(node.lstrip("-")):
            raise ValueError(
                f"{entry!r}: expected ADDRESS=NODE, the server address as captured and the "
                "broker's node id, e.g. 127.0.0.3:9092=2"
            )
        if address in out:
            raise ValueError(f"{address} is given twice ({address}={out[address]}, {entry})")
        out[address] = int(node)
    return out


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() alone passes superscripts, which int() refuses."""
    return text.isascii() and text.isdigit()


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def _normal(address: str) -> str:
    """host:port with an IPv6 host in brackets and names in lower case."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if _is_ip(host):
        parsed = ipaddress.ip_address(host)
        if parsed.version == 6 and parsed.ipv4_mapped is not None:
            return f"{parsed.ipv4_mapped}:{port}"
        return f"[{parsed}]:{port}" if parsed.version == 6 else f"{parsed}:{port}"
    return f"{host.lower().rstrip('.')}:{port}"
