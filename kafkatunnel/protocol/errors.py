"""Every way a byte stream can be wrong, each its own exception type.

The I/O layer catches `ProtocolError` per connection: a bad peer loses its own connection,
with the message saying what was wrong, and nothing else is affected.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class: the bytes on one connection are not valid Kafka protocol."""


class FrameSizeError(ProtocolError):
    """A frame's 4-byte size prefix is negative or above the configured maximum."""


class TruncatedFrame(ProtocolError):
    """The stream ended in the middle of a frame."""


class MalformedMessage(ProtocolError):
    """A frame's contents do not parse: a length runs past the end, a varint is too long."""


class UnknownApiKey(ProtocolError):
    """An API key this layer has no schema for, where a schema is needed."""


class UnsupportedVersion(ProtocolError):
    """A version of an API newer (or older) than this layer can parse, where parsing is needed."""


class UnmatchedResponse(ProtocolError):
    """A response whose correlation id matches no request in flight on its connection."""


class DuplicateCorrelationId(ProtocolError):
    """A request reuses the correlation id of a request still waiting for its response."""


class RefusedUnanswerable(ProtocolError):
    """A request a Policy refuses that cannot be answered (it expects no answer, or its
    answer cannot be built): its connection ends, as Kafka ends it."""
