"""Matching responses to requests on one connection.

Kafka answers requests on a connection in order, each response carrying its request's
correlation id; the response's layout depends on the request's API and version, which only
the request says. A Produce with acks=0 is never answered, so it is never tracked.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafkatunnel.protocol.errors import DuplicateCorrelationId, UnmatchedResponse
from kafkatunnel.protocol.headers import RequestHeader


@dataclass(frozen=True, slots=True)
class InFlight:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


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
        self._waiting[header.correlation_id] = InFlight(
            header.api_key, header.api_version, header.correlation_id, header.client_id
        )

    def response(self, correlation_id: int) -> InFlight:
        try:
            return self._waiting.pop(correlation_id)
        except KeyError:
            raise UnmatchedResponse(
                f"a response with correlation id {correlation_id} matches no request in flight "
                f"({len(self._waiting)} waiting)"
            ) from None
