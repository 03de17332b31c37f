"""Every field of a Kafka response that names a broker, read from the JSON message
definitions inside the reference cluster's kafka-clients jar (Apache Kafka's own, not
kio's copy), and for each the proof that the tunnel rewrites it at every version it lets a
client use, caps that version away, or leaves it alone for a reason that holds.

The rule for "a field that names a broker": a struct (in a response) with both a `Host`
and a `Port` field. ACL entries have a `Host` but no port: a principal's address, not a
broker's. The versions of such a field are those where its struct, every struct above it
and both `Host` and `Port` are present (tagged fields by their tagged versions).
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.demo.apache import (
    KAFKA_3_VERSION,
    KAFKA_VERSION,
    ApacheKafkaUnavailable,
    kafka_lib,
)
from kafkatunnel.protocol.errors import ProtocolError
from kafkatunnel.protocol.rewrite import (
    NOT_REWRITTEN_WITH_ENDPOINTS,
    REWRITTEN_APIS,
    needs_rewrite,
    rewrite_caps,
)
from kafkatunnel.protocol.schema import StructPlan, response_plan

# What the rule finds in Apache Kafka 4.4.0: (response, path to the struct) -> its versions.
# A Kafka that adds or moves one fails the test until this list, and the rewriter, follow.
BROKER_FIELDS = {
    ("ProduceResponse", "NodeEndpoints"): range(10, 14),
    ("FetchResponse", "NodeEndpoints"): range(16, 19),
    ("MetadataResponse", "Brokers"): range(0, 14),
    ("FindCoordinatorResponse", ""): range(0, 4),
    ("FindCoordinatorResponse", "Coordinators"): range(4, 7),
    ("DescribeClusterResponse", "Brokers"): range(0, 3),
    ("DescribeQuorumResponse", "Nodes.Listeners"): range(2, 3),
    ("ShareFetchResponse", "NodeEndpoints"): range(1, 3),
    ("ShareAcknowledgeResponse", "NodeEndpoints"): range(1, 3),
    ("VoteResponse", "NodeEndpoints"): range(1, 3),
    ("BeginQuorumEpochResponse", "NodeEndpoints"): range(1, 2),
    ("EndQuorumEpochResponse", "NodeEndpoints"): range(1, 2),
    ("FetchSnapshotResponse", "NodeEndpoints"): range(1, 2),
    ("UpdateRaftVoterResponse", "CurrentLeader"): range(0, 1),
    ("StreamsGroupHeartbeatResponse", "PartitionsByUserEndpoint.UserEndpoint"): range(0, 2),
    ("StreamsGroupDescribeResponse", "Groups.Members.UserEndpoint"): range(0, 2),
}
# Left alone, and why it holds: no broker listener serves them (the tunnel fronts only
# broker listeners), or the host and port are a Streams application's own.
CONTROLLERS_ONLY = {52, 53, 54, 59, 82}
APPLICATION_ENDPOINTS = {88, 89}


@dataclass(frozen=True)
class BrokerField:
    api_key: int
    message: str
    path: tuple[str, ...]  # the JSON field names from the response down to the struct
    versions: range


def _versions(spec: str | None, within: range) -> range:
    """A JSON versions string ("3+", "0-2", "5", "none") as a range inside `within`."""
    if spec is None or spec == "none":
        return range(0)
    low, _, high = spec.partition("-")
    start = int(low.rstrip("+"))
    stop = within.stop if low.endswith("+") else int(high or low) + 1
    return range(max(start, within.start), min(stop, within.stop))


def _field_versions(field: dict[str, Any], within: range) -> range:
    present = _versions(field.get("versions"), within)
    if "tag" in field:
        present = _versions(field.get("taggedVersions", field.get("versions")), present)
    return present


def _read(text: str) -> dict[str, Any]:
    """Kafka's message JSON: JSON with whole-line // comments."""
    parsed: dict[str, Any] = json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))
    return parsed


def broker_fields(messages: dict[str, dict[str, Any]]) -> list[BrokerField]:
    """Every struct with a Host and a Port in every response, with its versions."""
    found: list[BrokerField] = []
    for name, message in sorted(messages.items()):
        if message.get("type") == "response":
            common = {s["name"]: s["fields"] for s in message.get("commonStructs", [])}
            valid = _versions(message["validVersions"], range(0, 1 << 15))
            top = BrokerField(message["apiKey"], name, (), valid)
            found += _walk(message.get("fields", []), top, common)
    return found


def _walk(
    fields: list[dict[str, Any]], at: BrokerField, common: dict[str, list[dict[str, Any]]]
) -> list[BrokerField]:
    """The broker fields at and below a struct (`at`: its path, and the versions it has)."""
    found = []
    by_name = {f["name"]: f for f in fields}
    if "Host" in by_name and "Port" in by_name:
        host = _field_versions(by_name["Host"], at.versions)
        port = _field_versions(by_name["Port"], at.versions)
        both = range(max(host.start, port.start), min(host.stop, port.stop))
        if both:
            found.append(BrokerField(at.api_key, at.message, at.path, both))
    for field in fields:
        inner = field.get("fields") or common.get(field["type"].removeprefix("[]"))
        present = _field_versions(field, at.versions)
        if inner and present:
            below = BrokerField(at.api_key, at.message, (*at.path, field["name"]), present)
            found += _walk(inner, below, common)
    return found


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def rewriter_finds(api_key: int, version: int, path: tuple[str, ...]) -> str | None:
    """Why the rewriter would miss the address at `path` in this response version (None:
    it rewrites it): the passage must hold the response for rewriting, and the plan must
    have the struct as an address, under a node id. (tests/protocol/test_rewrite.py checks
    that the walk rewrites what the plans say, for every version held.)"""
    try:
        if not needs_rewrite(api_key, version):
            return "not held for rewriting (needs_rewrite is false)"
        plan: StructPlan = response_plan(api_key, version)
    except ProtocolError as error:
        return str(error)
    node_known = plan.node_field is not None
    for step in path:
        fields = [*plan.fields, *plan.tagged.values()]
        field = next((f for f in fields if f.name == _snake(step)), None)
        if field is None or field.struct is None:
            return f"{plan.name} has no struct field {_snake(step)}"
        index = plan.fields.index(field) if field in plan.fields else len(plan.fields)
        node_known = node_known and (plan.node_field or 0) < index
        plan = field.struct
        node_known = node_known or plan.node_field is not None
    if plan.address is None:
        return f"{plan.name}: no host and port planned"
    if not node_known:
        return f"{plan.name}: no node id above or beside its host and port"
    return None


def messages_of(version: str) -> dict[str, dict[str, Any]]:
    """common/message/*.json from the kafka-clients jar of that Apache Kafka version."""
    try:
        lib = kafka_lib(version)
    except ApacheKafkaUnavailable as missing:
        pytest.skip(str(missing))
    jar = Path(lib) / f"kafka-clients-{version}.jar"
    with zipfile.ZipFile(jar) as archive:
        return {
            Path(entry).stem: _read(archive.read(entry).decode())
            for entry in archive.namelist()
            if entry.startswith("common/message/") and entry.endswith(".json")
        }


@pytest.fixture(scope="module")
def kafka_messages() -> dict[str, dict[str, Any]]:
    """The reference cluster's message definitions."""
    return messages_of(KAFKA_VERSION)


def test_the_fields_that_name_brokers_are_the_ones_listed(
    kafka_messages: dict[str, dict[str, Any]],
) -> None:
    found = {(f.message, ".".join(f.path)): f.versions for f in broker_fields(kafka_messages)}
    assert found == BROKER_FIELDS


@pytest.mark.parametrize("version", [KAFKA_VERSION, KAFKA_3_VERSION])
def test_the_tunnel_rewrites_every_broker_field_at_every_version_it_lets_clients_use(
    version: str,
) -> None:
    """A rewritten API: each version inside the tunnel's cap has the address in the
    rewriter's plan (the other versions are capped away in ApiVersions answers). Any other
    API with such a field must be one no broker listener serves, or a Streams group API
    (application endpoints). On the reference cluster's Kafka and on the last 3.x."""
    kafka_messages = messages_of(version)
    caps = rewrite_caps()
    listeners = {
        m["apiKey"]: set(m.get("listeners", []))
        for m in kafka_messages.values()
        if m.get("type") == "request"
    }
    missed = []
    for field in broker_fields(kafka_messages):
        where = f"{field.message}.{'.'.join(field.path) or '(top)'}"
        key = field.api_key
        if key in REWRITTEN_APIS:
            allowed = [v for v in field.versions if v in caps[key]]
            missed += [f"{where} v{v}: {why}" for v in allowed
                       if (why := rewriter_finds(key, v, field.path))]  # fmt: skip
            continue
        controllers_only = key in CONTROLLERS_ONLY and "broker" not in listeners[key]
        application = key in APPLICATION_ENDPOINTS and field.path[-1] == "UserEndpoint"
        if controllers_only or application:
            assert key in NOT_REWRITTEN_WITH_ENDPOINTS, where
        else:
            missed.append(f"{where} v{field.versions.start}-{field.versions.stop - 1}: "
                          f"API {key} is neither rewritten nor capped")  # fmt: skip
    assert missed == []


def test_the_caps_on_4_4_brokers(kafka_messages: dict[str, dict[str, Any]]) -> None:
    """What the tunnel caps away of what a 4.4 broker offers of the rewritten APIs: nothing
    (kio, the rewriter's schemas, knows every version 4.4 defines of them)."""
    caps = rewrite_caps()
    offered = {
        m["apiKey"]: _versions(m["validVersions"], range(0, 1 << 15))
        for m in kafka_messages.values()
        if m.get("type") == "response" and m["apiKey"] in caps
    }
    capped = {key: [v for v in versions if v not in caps[key]] for key, versions in offered.items()}
    assert {key: lost for key, lost in capped.items() if lost} == {}
