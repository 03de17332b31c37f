"""Sans-I/O Kafka protocol: framing, headers, correlation, address rewriting, coordinator
hashing. Pure functions and small state machines over bytes; no sockets, no asyncio, no
callbacks: what the caller must act on comes back as a value.

This is the package's public face; its modules are its own business (a layering test
holds callers to these names).

- A proxied connection: an `Exchange` (or, transparent, a `PassThrough`) has two
  `Direction`s. `feed(bytes)` returns `Fed`: the chunks to pass on, the brokers to learn
  before it goes on (then `resume()`), and, when observed, the frames that passed whole
  (`FramePassed`, a recording's events).
- Frames, headers and errors: `FrameDecoder`, `frame`, `parse_request_header`, ...,
  and `ProtocolError` with its kinds: what bad input raises, and nothing else.
- Brokers: `BrokerAddress`, `Mapper` (what the tunnel's registry provides) and the
  rewriting of the answers that name them.
- Coordinators: which broker a group or transaction lands on.
- A local run's own ids: an `Isolation` (`up --isolate`) maps every group and
  transactional id clients send to its isolated form, and back in the answers.
- A guard: the `Policy` of requests refused (`up --read-only`, `--deny-api`, and a
  client's own SASL login when the tunnel logs in for it), and the answer Kafka gives an
  unauthorized client, built for a refused request (`refusal`), or the tunnel's answer to
  a client's own login (`own_login_answer`).
- Logging in: `Login` (the tunnel's own SASL login to a broker) with a `Mechanism`
  (`Plain`, `Scram`, `OAuthBearer`), ending `LoggedIn` or `LoginFailed`.
- Reading messages by their schema (recording redaction, verification): plans, walks and
  the `wire` encodings.
- Text a broker or another server wrote, on its way to the user's eyes: `one_line`.
"""

from kafkatunnel.protocol import wire
from kafkatunnel.protocol.answers import RewrittenAnswers
from kafkatunnel.protocol.api_versions import (
    cap_api_versions,
    misdirected_to,
    narrowest,
    readable_caps,
)
from kafkatunnel.protocol.coordinator import (
    COORDINATOR_ERRORS,
    DEFAULT_PARTITIONS,
    GROUP_TOPIC,
    NOT_COORDINATOR,
    TRANSACTION_TOPIC,
    java_string_hash,
    kafka_abs,
    partition_for,
)
from kafkatunnel.protocol.correlation import CorrelationTracker, InFlight
from kafkatunnel.protocol.errors import (
    DuplicateCorrelationId,
    FrameSizeError,
    MalformedMessage,
    ProtocolError,
    RefusedUnanswerable,
    TruncatedFrame,
    UnknownApiKey,
    UnmatchedResponse,
    UnsupportedVersion,
)
from kafkatunnel.protocol.framing import DEFAULT_MAX_FRAME_SIZE, SIZE_PREFIX, FrameDecoder, frame
from kafkatunnel.protocol.headers import (
    RequestHeader,
    expects_response,
    parse_request_header,
    response_body_offset,
    response_correlation_id,
    response_header_version,
    top_level_error,
)
from kafkatunnel.protocol.isolation import Isolation, check_suffix, isolating_caps
from kafkatunnel.protocol.own_login import LOGIN_APIS, mechanisms_told, own_login_answer, told
from kafkatunnel.protocol.passage import (
    REQUEST_HEAD,
    RESPONSE_HEAD,
    Chunk,
    DeployedAsk,
    Direction,
    Exchange,
    ExchangeStats,
    Fed,
    FramePassed,
    Part,
    PassThrough,
    ReadRequest,
    RecordSpans,
)
from kafkatunnel.protocol.policy import (
    READ_ONLY,
    Policy,
    PolicyError,
    api_key_of,
    read_request,
)
from kafkatunnel.protocol.refusal import (
    AUTHORIZATION_ERRORS,
    authorization_error,
    refusal,
    refused_answer,
)
from kafkatunnel.protocol.rewrite import (
    REWRITTEN_APIS,
    BrokerAddress,
    ByteWalk,
    Mapper,
    Rewritten,
    UnknownBroker,
    addresses_in,
    keep_address,
    needs_rewrite,
    rewrite_caps,
    rewrite_response,
    splice,
)
from kafkatunnel.protocol.sasl_login import CLOSED_DURING_LOGIN, LoggedIn, Login, LoginFailed
from kafkatunnel.protocol.sasl_mechanisms import (
    SCRAM_HASHES,
    Mechanism,
    MechanismError,
    OAuthBearer,
    Plain,
    Scram,
)
from kafkatunnel.protocol.schema import (
    FieldPlan,
    StructPlan,
    api_name,
    api_title,
    known_versions,
    request_plan,
    response_plan,
)
from kafkatunnel.protocol.streaming import RESPONSE_WALK_START, TAIL, Walk, carrying_records, walk
from kafkatunnel.protocol.untrusted_text import one_line

__all__ = [  # noqa: RUF022 - grouped as the docstring tells them
    # a proxied connection
    "Chunk",
    "Direction",
    "RewrittenAnswers",
    "Exchange",
    "ExchangeStats",
    "Fed",
    "DeployedAsk",
    "FramePassed",
    "Part",
    "PassThrough",
    "ReadRequest",
    "RecordSpans",
    "REQUEST_HEAD",
    "RESPONSE_HEAD",
    # a local run's own group and transactional ids (up --isolate)
    "Isolation",
    "check_suffix",
    "isolating_caps",
    # frames and headers
    "DEFAULT_MAX_FRAME_SIZE",
    "SIZE_PREFIX",
    "CorrelationTracker",
    "FrameDecoder",
    "InFlight",
    "RequestHeader",
    "cap_api_versions",
    "narrowest",
    "readable_caps",
    "misdirected_to",
    "expects_response",
    "frame",
    "parse_request_header",
    "response_body_offset",
    "response_correlation_id",
    "response_header_version",
    "top_level_error",
    # errors: what bad input raises
    "DuplicateCorrelationId",
    "FrameSizeError",
    "MalformedMessage",
    "ProtocolError",
    "RefusedUnanswerable",
    "TruncatedFrame",
    "UnknownApiKey",
    "UnmatchedResponse",
    "UnsupportedVersion",
    # brokers
    "REWRITTEN_APIS",
    "BrokerAddress",
    "Mapper",
    "Rewritten",
    "UnknownBroker",
    "addresses_in",
    "needs_rewrite",
    "rewrite_caps",
    "rewrite_response",
    # coordinators
    "COORDINATOR_ERRORS",
    "DEFAULT_PARTITIONS",
    "GROUP_TOPIC",
    "NOT_COORDINATOR",
    "TRANSACTION_TOPIC",
    "java_string_hash",
    "kafka_abs",
    "partition_for",
    # a guard
    "AUTHORIZATION_ERRORS",
    "LOGIN_APIS",
    "READ_ONLY",
    "Policy",
    "PolicyError",
    "api_key_of",
    "authorization_error",
    "mechanisms_told",
    "own_login_answer",
    "read_request",
    "refusal",
    "refused_answer",
    "told",
    # logging in
    "CLOSED_DURING_LOGIN",
    "SCRAM_HASHES",
    "LoggedIn",
    "Login",
    "LoginFailed",
    "Mechanism",
    "MechanismError",
    "OAuthBearer",
    "Plain",
    "Scram",
    # reading messages by their schema
    "RESPONSE_WALK_START",
    "TAIL",
    "ByteWalk",
    "FieldPlan",
    "StructPlan",
    "Walk",
    "api_name",
    "api_title",
    "carrying_records",
    "keep_address",
    "known_versions",
    "request_plan",
    "response_plan",
    "splice",
    "walk",
    "wire",
    # text from the network, shown
    "one_line",
]
