"""Sans-I/O Kafka protocol: framing, headers, correlation, address rewriting, coordinator
hashing. Pure functions and small state machines over bytes; no sockets, no asyncio."""

from kafkatunnel.protocol.api_versions import cap_api_versions
from kafkatunnel.protocol.coordinator import java_string_hash, kafka_abs, partition_for
from kafkatunnel.protocol.correlation import CorrelationTracker, InFlight
from kafkatunnel.protocol.errors import (
    DuplicateCorrelationId,
    FrameSizeError,
    MalformedMessage,
    ProtocolError,
    TruncatedFrame,
    UnknownApiKey,
    UnmatchedResponse,
    UnsupportedVersion,
)
from kafkatunnel.protocol.framing import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, frame
from kafkatunnel.protocol.headers import (
    RequestHeader,
    expects_response,
    parse_request_header,
    response_correlation_id,
)
from kafkatunnel.protocol.rewrite import (
    REWRITTEN_APIS,
    BrokerAddress,
    Mapper,
    Rewritten,
    addresses_in,
    needs_rewrite,
    rewrite_caps,
    rewrite_response,
)

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "REWRITTEN_APIS",
    "BrokerAddress",
    "CorrelationTracker",
    "DuplicateCorrelationId",
    "FrameDecoder",
    "FrameSizeError",
    "InFlight",
    "MalformedMessage",
    "Mapper",
    "ProtocolError",
    "RequestHeader",
    "Rewritten",
    "TruncatedFrame",
    "UnknownApiKey",
    "UnmatchedResponse",
    "UnsupportedVersion",
    "addresses_in",
    "cap_api_versions",
    "expects_response",
    "frame",
    "java_string_hash",
    "kafka_abs",
    "needs_rewrite",
    "parse_request_header",
    "partition_for",
    "response_correlation_id",
    "rewrite_caps",
    "rewrite_response",
]
