"""A tiny blocking Kafka client for look-ups: which broker coordinates a group or a
transactional id. Requests and responses are encoded by kio; framing is ours.

Stands alone at the top: the tunnel, doctor, verify's replay, the command line and the
local cluster all ask the cluster things, and none of them owns the asking."""

from __future__ import annotations

import datetime
import io
import re
import socket
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

from kafkatunnel.hostnames import join_address, split_address
from kafkatunnel.protocol import (
    BrokerAddress,
    FrameDecoder,
    ProtocolError,
    api_title,
    frame,
    response_body_offset,
    top_level_error,
)

API_VERSIONS, FIND_COORDINATOR, METADATA, DESCRIBE_CLUSTER = 18, 10, 3, 60
SASL_HANDSHAKE = 17
NONE, UNSUPPORTED_SASL_MECHANISM = 0, 33
# A SASL mechanism no broker enables (RFC 4422 names are upper case): what a handshake asks
# for to learn whether a listener wants a login. Apache Kafka answers with the mechanisms it
# enables; tansu 0.6 echoes this one, and closes at once on an upper-case name it lacks.
PROBE_MECHANISM = "kafkatunnel-probe"
OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, DESCRIBE_TRANSACTIONS = 9, 11, 12, 13, 65
KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION = 0, 1

Connect = Callable[[str, int, float], socket.socket]


def _tcp(host: str, port: int, timeout: float) -> socket.socket:
    return socket.create_connection((host, port), timeout=timeout)


class ErrorAnswer(Exception):
    """An error answer the broker sent in a form that cannot be decoded whole."""

    def __init__(self, code: int) -> None:
        super().__init__(f"error code {code}")
        self.code = code


@dataclass(frozen=True)
class Coordinator:
    key: str
    node_id: int
    host: str
    port: int
    error_code: int

    @property
    def address(self) -> str:
        return join_address(self.host, self.port)


CLIENT_ID = "kafkatunnel"  # a probe's client id; each of the tool's own parts adds its name


def own_client(client_id: str | None) -> str | None:
    """The client id when it is this tool's own (`kafkatunnel`, `kafkatunnel-doctor`...),
    else None: verify reports the tool's own look-ups apart from the applications'. Only
    the shapes the tool sends count: a recording's client ids are anybody's text."""
    if client_id is not None and _OWN_CLIENT.fullmatch(client_id):
        return client_id
    return None


_OWN_CLIENT = re.compile(re.escape(CLIENT_ID) + r"(-[a-z]{1,20})?")


def encode_request(payload: Any, correlation_id: int, client_id: str = CLIENT_ID) -> bytes:
    """A whole request frame for a kio request payload."""
    header_type: Any = RequestHeaderV2 if payload.__flexible__ else RequestHeaderV1
    header = header_type(
        request_api_key=int(payload.__api_key__),
        request_api_version=int(payload.__version__),
        correlation_id=correlation_id,
        client_id=client_id,
    )
    out = io.BytesIO()
    entity_writer(header_type)(out, header)
    entity_writer(type(payload))(out, payload)
    return frame(out.getvalue())


PROBE_CORRELATION_ID = 0x6B74  # "kt": a health check's one request


def api_versions_request(correlation_id: int = PROBE_CORRELATION_ID) -> bytes:
    """ApiVersions v0: the one request every broker answers, before any authentication
    (what `up`'s start check and the port-forward probe ask)."""
    return encode_request(load_request_schema(API_VERSIONS, 0)(), correlation_id)


def metadata_request(correlation_id: int) -> bytes:
    """Metadata v1 for no topic: the broker list only."""
    request_type: Any = load_request_schema(METADATA, 1)
    return encode_request(request_type(topics=()), correlation_id)


def sasl_handshake_request(correlation_id: int) -> bytes:
    """SaslHandshake v1 for PROBE_MECHANISM: whether, and how, a listener wants a login
    (its answer read by mechanisms_wanted)."""
    request_type: Any = load_request_schema(SASL_HANDSHAKE, 1)
    return encode_request(request_type(mechanism=PROBE_MECHANISM), correlation_id)


GROUP_COORDINATOR_VERSION = 3  # one key, flexible: every broker from Kafka 2.4 to 4.x


def group_coordinator_request(group: str, correlation_id: int) -> bytes:
    """FindCoordinator v3 for a consumer group (its answer: node_id, host, port)."""
    request_type: Any = load_request_schema(FIND_COORDINATOR, GROUP_COORDINATOR_VERSION)
    return encode_request(request_type(key=group, key_type=KEY_TYPE_GROUP), correlation_id)


# A mechanism's name as RFC 4422 3.1 allows it: the broker's answer is shown to the user
# and suggested as a client setting, so nothing else of it is (no newline, no escape).
SASL_MECHANISM = re.compile(r"[A-Z0-9_-]{1,20}\Z", re.IGNORECASE)
MAX_MECHANISMS = 8


def mechanisms_wanted(response: Any) -> tuple[str, ...] | None:
    """The SASL mechanisms a listener wants a login with, from its answer to a SaslHandshake
    for PROBE_MECHANISM (empty: it named none); None: it wants no login. A listener that
    wants one answers the handshake itself, before any login (Apache Kafka: with the
    mechanisms it enables); one without SASL, as a request out of place."""
    if int(response.error_code) not in (NONE, UNSUPPORTED_SASL_MECHANISM):
        return None
    named = (str(m) for m in response.mechanisms if m != PROBE_MECHANISM)
    return tuple(m for m in named if SASL_MECHANISM.match(m))[:MAX_MECHANISMS]


def decode_answer(answer: bytes, api_key: int, version: int) -> Any:
    """A whole response frame, decoded by kio: ErrorAnswer for an error answer it cannot
    decode whole, ConnectionError for any other answer it cannot decode."""
    body = response_body_offset(answer, api_key, version)
    response_type = load_response_schema(api_key, version)
    try:
        value, _ = entity_reader(response_type)(answer[body:], 0)
    except Exception as error:  # kio's own errors: an answer it cannot decode whole
        code = top_level_error(answer, api_key, version)
        if code is None or code == 0:
            raise ConnectionError(f"an answer that cannot be decoded: {error}") from None
        raise ErrorAnswer(code) from None
    return value


class ProbeConnection:
    """One connection that sends requests one at a time and waits for each answer."""

    def __init__(
        self,
        address: str,
        timeout: float = 5.0,
        connect: Connect = _tcp,
        client_id: str = CLIENT_ID,
    ) -> None:
        host, port = split_address(address)
        self.client_id = client_id
        self.sock = connect(host, port, timeout)
        self.sock.settimeout(timeout)
        self._decoder = FrameDecoder()
        self._correlation = 0
        self._versions: dict[int, tuple[int, int]] | None = None

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> ProbeConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, payload: Any) -> Any:
        api_key, version = int(payload.__api_key__), int(payload.__version__)
        self._correlation += 1
        self.sock.sendall(encode_request(payload, self._correlation, self.client_id))
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the broker closed the connection before answering")
            frames = self._decoder.feed(chunk)
            if frames:
                break
        return decode_answer(frames[0], api_key, version)

    def login_mechanisms(self) -> tuple[str, ...] | None:
        """The SASL mechanisms this listener wants a login with before it answers anything
        else (see mechanisms_wanted); None: it wants none."""
        request_type: Any = load_request_schema(SASL_HANDSHAKE, 1)
        try:
            return mechanisms_wanted(self.request(request_type(mechanism=PROBE_MECHANISM)))
        except ErrorAnswer:
            return None

    def api_versions(self) -> dict[int, tuple[int, int]]:
        if self._versions is None:
            response = self.request(load_request_schema(API_VERSIONS, 0)())
            self._versions = {
                int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys
            }
        return self._versions

    def brokers(self) -> list[BrokerAddress]:
        """Every broker, from a Metadata v1 request for no topic."""
        request_type: Any = load_request_schema(METADATA, 1)
        response = self.request(request_type(topics=()))
        return [BrokerAddress(int(b.node_id), b.host, int(b.port)) for b in response.brokers]

    def pick(self, api_key: int, newest: int, oldest: int = 0) -> tuple[Any, int]:
        """The request schema and version to send: the newest in [oldest, newest] that the
        broker has; ConnectionError when it has none of them."""
        low, high = self.api_versions().get(api_key, (0, -1))
        version = min(high, newest)
        if version < max(low, oldest):
            raise ConnectionError(
                f"this broker has no {api_title(api_key)} version from v{oldest} to v{newest}"
            )
        return load_request_schema(api_key, version), version

    def describe_cluster(self) -> list[BrokerAddress]:
        """Every broker, from DescribeCluster (sent to this broker, not routed to a
        controller as admin clients do)."""
        request_type, _ = self.pick(DESCRIBE_CLUSTER, 0)
        response = self.request(request_type(include_cluster_authorized_operations=False))
        return [BrokerAddress(int(b.broker_id), b.host, int(b.port)) for b in response.brokers]

    def partition_leaders(self, topic: str) -> dict[int, int]:
        """partition -> leader node id, from a Metadata v1 request for `topic`."""
        request_type: Any = load_request_schema(METADATA, 1)
        topic_type = request_type.__dataclass_fields__["topics"].type.__args__[0].__args__[0]
        response = self.request(request_type(topics=(topic_type(name=topic),)))
        for entry in response.topics:
            if entry.name == topic:
                return {int(p.partition_index): int(p.leader_id) for p in entry.partitions}
        return {}

    def offset_fetch_error(self, group: str) -> int:
        """The group-level error of a read-only OffsetFetch (v2 to v7) for no partition:
        the coordinator check is the same, and the answer is small. (Asking for all topics,
        tansu 0.5 answers in a shape no schema reads: v2 without its topics array, v7
        without its tagged fields.)"""
        request_type, version = self.pick(OFFSET_FETCH, 7, oldest=2)
        fields: dict[str, Any] = {"group_id": group, "topics": ()}
        if version >= 7:
            fields["require_stable"] = False
        return self._error_of(request_type(**fields))

    def _error_of(self, payload: Any) -> int:
        try:
            return int(self.request(payload).error_code)
        except ErrorAnswer as error:
            return error.code

    def heartbeat_error(self, group: str, member: str = "kafkatunnel-replay") -> int:
        """The error of a Heartbeat as a member that cannot exist: it changes nothing, and
        only the group's coordinator answers it with a membership error rather than
        NOT_COORDINATOR (some brokers, the librdkafka mock among them, answer OffsetFetch
        anywhere)."""
        request_type, version = self.pick(HEARTBEAT, 4)
        fields: dict[str, Any] = {"group_id": group, "generation_id": -1, "member_id": member}
        if version >= 3:
            fields["group_instance_id"] = None
        return self._error_of(request_type(**fields))

    def join_group_error(self, group: str) -> tuple[int, str]:
        """A JoinGroup as a new member of a throw-away group: (error, member id). The
        coordinator answers MEMBER_ID_REQUIRED (v4+) or lets the member in; any other broker
        answers NOT_COORDINATOR."""
        request_type, version = self.pick(JOIN_GROUP, 5)
        protocol_type = request_type.__dataclass_fields__["protocols"].type
        protocol: Any = typing.get_args(protocol_type)[0]
        fields: dict[str, Any] = {
            "group_id": group, "session_timeout": datetime.timedelta(seconds=6),
            "member_id": "", "protocol_type": "consumer",
            "protocols": (protocol(name="range", metadata=b""),),
        }  # fmt: skip
        if version >= 1:
            fields["rebalance_timeout"] = datetime.timedelta(seconds=6)
        if version >= 5:
            fields["group_instance_id"] = None
        try:
            response = self.request(request_type(**fields))
        except ErrorAnswer as error:
            return error.code, ""
        return int(response.error_code), str(response.member_id or "")

    def leave_group(self, group: str, member: str) -> None:
        request_type, _ = self.pick(LEAVE_GROUP, 2)
        self.request(request_type(group_id=group, member_id=member))

    def describe_transaction_error(self, transactional_id: str) -> int | None:
        """The error of DescribeTransactions for one id; None if the broker lacks the API."""
        try:
            request_type, _ = self.pick(DESCRIBE_TRANSACTIONS, 0)
        except ConnectionError:
            return None
        response = self.request(request_type(transactional_ids=(transactional_id,)))
        return int(response.transaction_states[0].error_code)

    def keys_by_coordinator(
        self,
        prefix: str,
        count: int,
        *,
        transactional: bool = False,
        nodes: set[int] | None = None,
        tries: int = 500,
    ) -> dict[int, Coordinator]:
        """Keys `prefix-0`, `prefix-1`... looked up until `count` coordinators (of `nodes`,
        if given) have one each: node id -> its first key's coordinator."""
        found: dict[int, Coordinator] = {}
        for index in range(tries):
            coordinator = self.find_coordinator(f"{prefix}-{index}", transactional)
            if nodes is None or coordinator.node_id in nodes:
                found.setdefault(coordinator.node_id, coordinator)
            if len(found) == count:
                break
        return found

    def find_coordinator(self, key: str, transactional: bool = False) -> Coordinator:
        request_type, version = self.pick(FIND_COORDINATOR, 4)
        key_type = KEY_TYPE_TRANSACTION if transactional else KEY_TYPE_GROUP
        if version >= 4:
            response = self.request(request_type(key_type=key_type, coordinator_keys=(key,)))
            c = response.coordinators[0]
            return Coordinator(key, int(c.node_id), c.host, int(c.port), int(c.error_code))
        fields = {"key": key} if version == 0 else {"key": key, "key_type": key_type}
        r = self.request(request_type(**fields))
        return Coordinator(key, int(r.node_id), r.host, int(r.port), int(r.error_code))


def wanted_login(address: str, timeout: float = 5.0) -> tuple[str, ...] | None:
    """The SASL mechanisms `address` wants a login with (ProbeConnection.login_mechanisms);
    None also when it cannot be asked."""
    try:
        with ProbeConnection(address, timeout) as connection:
            return connection.login_mechanisms()
    except (OSError, ValueError, ProtocolError):
        return None


def find_coordinator(
    bootstrap: str,
    key: str,
    *,
    transactional: bool = False,
    timeout: float = 5.0,
    connect: Connect = _tcp,
    client_id: str = CLIENT_ID,
) -> Coordinator:
    """Ask the first reachable bootstrap broker which broker coordinates `key`."""
    errors = []
    for address in bootstrap.split(","):
        try:
            with ProbeConnection(address.strip(), timeout, connect, client_id) as connection:
                return connection.find_coordinator(key, transactional)
        except OSError as error:
            errors.append(f"{address}: {error}")
    raise ConnectionError("no bootstrap broker answered: " + "; ".join(errors))
