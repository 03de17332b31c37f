"""Matching responses to requests on one connection.

Kafka answers requests on a connection in order, each response carrying its request's
correlation id; the response's layout depends on the request's API and version, which only
the request says. A Produce with acks=0 is never answered, so it is never tracked.
"""

from __future__ import annotations

from kafkatunnel.protocol.errors import DuplicateCorrelationId, UnmatchedResponse
from kafkatunnel.protocol.headers import RequestHeader

# What a response is read by: the header of the request it answers (kept as it was read,
# one object less per request).
InFlight = RequestHeader


class CorrelationTracker:
    """Requests waiting for a response, by correlation id."""

    def __init__(self) -> None:
        self._waiting: dict[int, InFlight] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def request(self, header: RequestHeader, expects_response: bool = True) -> None:
        if not expects_response:
            return
        if header.correlation_id in self._waiting:
            raise DuplicateCorrelationId(
                f"correlation id {header.correlation_id} is reused while a request with it "
                "is still waiting for its response"
            )
        self._waiting[header.correlation_id] = header

    def response(self, correlation_id: int) -> InFlight:
        try:
            return self._waiting.pop(correlation_id)
        except KeyError:
            raise UnmatchedResponse(
                f"a response with correlation id {correlation_id} matches no request in flight "
                f"({len(self._waiting)} waiting)"
            ) from None
