"""The protocol layer's contract under garbage: it raises ProtocolError, never anything else.

Shared by the test suite (a few thousand cases) and `scripts/bench_protocol.py --fuzz`
(10^5 and more), so both exercise the very same entry points.
"""

from __future__ import annotations

import contextlib

from kafkatunnel.protocol import ProtocolError
from kafkatunnel.protocol.api_versions import cap_api_versions
from kafkatunnel.protocol.correlation import CorrelationTracker
from kafkatunnel.protocol.framing import FrameDecoder
from kafkatunnel.protocol.headers import expects_response, parse_request_header
from kafkatunnel.protocol.rewrite import REWRITTEN_APIS, BrokerAddress, rewrite_response
from kafkatunnel.protocol.schema import known_versions

TARGETS = [(key, version) for key in REWRITTEN_APIS for version in known_versions(key)]
TARGETS += [(18, version) for version in range(5)]


def _mapper(address: BrokerAddress) -> tuple[str, int]:
    return ("127.0.0.1", 9093 + address.node_id % 100)


def exercise(data: bytes, target: int, chunk: int) -> None:
    """Push `data` through every entry point; only ProtocolError may escape."""
    api_key, version = TARGETS[target % len(TARGETS)]
    size = len(data).to_bytes(4, "big")
    decoder = FrameDecoder(max_frame_size=1 << 16)
    tracker = CorrelationTracker()
    try:
        for start in range(0, len(data), max(chunk, 1)):
            for frame in decoder.feed(data[start : start + max(chunk, 1)]):
                header = parse_request_header(frame)
                tracker.request(header, expects_response(frame, header))
        decoder.close()
    except ProtocolError:
        pass
    for attempt in (
        lambda: parse_request_header(size + data),
        lambda: rewrite_response(size + data, api_key, version, _mapper),
        lambda: cap_api_versions(size + data, version, {3: range(0, 13)}),
    ):
        with contextlib.suppress(ProtocolError):
            attempt()
