"""A recording without payloads lets record data pass unread: the Exchange marks only the
bytes inside record sets as unread (Produce requests, Fetch answers of every version), and
a trace told "n bytes went by unread" writes exactly the packets it writes when it read
everything. Any chunking, any splicing, every version kio knows."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkatunnel.capture.trace import ConnectionTrace, Request
from kafkatunnel.protocol.headers import parse_request_header
from kafkatunnel.protocol.passage import REQUEST_HEAD, RESPONSE_HEAD, Direction, Exchange
from kafkatunnel.protocol.rewrite import BrokerAddress, rewrite_caps
from kafkatunnel.protocol.schema import known_versions
from tests.kio_messages import (
    DESCEND,
    encode,
    fetch_request,
    replace_fields,
    request_frame,
    requests,
    response_frame,
)
from tests.kio_messages import responses as response_messages

FAST = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CLIENT, SERVER = ("127.0.0.1", 40001), ("127.0.0.1", 19094)
PRODUCE, FETCH = 0, 1


def tunnel_mapper(address: BrokerAddress) -> tuple[str, int]:
    """A tunnel port for any node id kio may draw (leader hints in Produce answers too)."""
    return ("127.0.0.1", 19093 + address.node_id % 1000)


@dataclass
class Seen:
    """What a Pump hands a recording: chunks read, and counts of bytes spliced past."""

    events: list[bytes | int] = field(default_factory=list)
    out: bytearray = field(default_factory=bytearray)
    unread_spans: list[tuple[int, int]] = field(default_factory=list)  # in the input stream


def drive(direction: Direction, stream: bytes, cuts: list[int]) -> Seen:
    """Feed `stream` in pieces of the sizes in `cuts`, splicing whatever the direction lets
    pass unread, as the relay does."""
    seen = Seen()
    position = step = 0
    while position < len(stream):
        unread = direction.unread
        if unread:
            size = min(unread, cuts[step % len(cuts)], len(stream) - position)
            direction.skip(size)
            seen.events.append(size)
            seen.unread_spans.append((position, position + size))
            seen.out += stream[position : position + size]
        else:
            size = min(cuts[step % len(cuts)], len(stream) - position)
            chunks = direction.feed(stream[position : position + size])
            data = b"".join(chunks)
            seen.events.append(data)
            seen.out += data
        position += size
        step += 1
    direction.close()
    return seen


def record_spans(stream: bytes, record_sets: list[bytes]) -> list[tuple[int, int]]:
    spans = []
    start = 0
    for records in record_sets:
        at = stream.index(records, start)
        spans.append((at, at + len(records)))
        start = at + len(records)
    return spans


def _with_unique_records(message: Any, rnd: random.Random) -> Any:
    """The message with every non-empty record set replaced by random bytes long enough to
    be found in the stream by value (hypothesis' one-byte record sets would match headers)."""

    def unique(field: dataclasses.Field[Any], value: Any) -> Any:
        if field.name == "records" and isinstance(value, bytes):
            return rnd.randbytes(rnd.randint(24, 3000)) if value else value
        return DESCEND if field.metadata.get("tag") is None else value

    return replace_fields(message, unique)


def _records_of(message: object) -> list[bytes]:
    """Every non-empty record set in a kio message, in wire order."""
    found: list[bytes] = []
    if isinstance(message, tuple):
        for item in message:
            found += _records_of(item)
    elif dataclasses.is_dataclass(message) and not isinstance(message, type):
        for f in dataclasses.fields(message):
            value = getattr(message, f.name)
            if f.name == "records" and isinstance(value, bytes):
                found += [value] if value else []
            elif f.metadata.get("tag") is None:
                found += _records_of(value)
    return found


Told = list[tuple[int, tuple[tuple[int, int], ...], bool, Request | None]]


def _trace(
    requests_in: list[bytes | int],
    responses_in: list[bytes | int],
    told: tuple[Told, Told] = ([], []),
) -> list[bytes]:
    """The packets a trace writes for these events; `told`: where the relay's walk said
    each frame's records lay (then the trace need not walk them)."""
    trace = ConnectionTrace(CLIENT, SERVER)
    for spans in told[0]:
        trace.records_in_request(*spans)
    for spans in told[1]:
        trace.records_in_response(*spans)
    packets = []
    for event in requests_in:
        packets += (
            trace.unread_from_client(event)
            if isinstance(event, int)
            else trace.from_client([event])
        )
    for event in responses_in:
        if isinstance(event, int):
            packets += trace.unread_to_client(event)
        else:
            packets += trace.to_client([event])
    assert trace.broken is None
    return packets


def _versions(api_key: int, first: int) -> list[int]:
    return [v for v in known_versions(api_key) if v >= first]


@FAST
@given(
    data=st.data(),
    produce_version=st.sampled_from(_versions(PRODUCE, 3)),
    fetch_version=st.sampled_from(_versions(FETCH, 4)),
    cuts=st.lists(st.integers(1, 300), min_size=1, max_size=6),
)
def test_only_record_data_passes_unread_and_the_trace_is_the_same(
    data: st.DataObject, produce_version: int, fetch_version: int, cuts: list[int]
) -> None:
    rnd = data.draw(st.randoms(use_true_random=False))
    produced = _with_unique_records(data.draw(requests(PRODUCE, produce_version)), rnd)
    fetched = _with_unique_records(data.draw(response_messages(FETCH, fetch_version)), rnd)
    request_stream = request_frame(produced, 1) + fetch_request(fetch_version, 2)
    response_stream = response_frame(FETCH, fetch_version, encode(fetched), 2)
    if produced.acks != 0:
        answer = data.draw(response_messages(PRODUCE, produce_version))
        response_stream = response_frame(PRODUCE, produce_version, encode(answer), 1) + (
            response_stream
        )

    # What the client receives when nothing passes unread: the reference.
    reading = Exchange(tunnel_mapper, rewrite_caps())
    whole_requests = b"".join(reading.requests.feed(request_stream))
    whole_responses = b"".join(reading.responses.feed(response_stream))

    splicing = Exchange(tunnel_mapper, rewrite_caps(), records_only=True)
    told: tuple[Told, Told] = ([], [])
    splicing.tell_records(
        lambda *spans: told[0].append(spans), lambda *spans: told[1].append(spans)
    )
    sent = drive(splicing.requests, request_stream, cuts)
    received = drive(splicing.responses, response_stream, cuts)
    assert bytes(sent.out) == whole_requests == request_stream
    assert received.out == whole_responses

    # Nothing but record data went by unread...
    for seen, stream, message in (
        (sent, request_stream, produced),
        (received, response_stream, fetched),
    ):
        inside = record_spans(stream, _records_of(message))
        for start, end in seen.unread_spans:
            assert any(a <= start and end <= b for a, b in inside), (start, end, inside)
    # ...and all of it did, but for what came in the frame's head or in the same piece as
    # the bytes before it (the relay reads at least 16 KiB at a time: so would it).
    for seen, message, head in ((sent, produced, REQUEST_HEAD), (received, fetched, RESPONSE_HEAD)):
        records = _records_of(message)
        unread = sum(e for e in seen.events if isinstance(e, int))
        assert unread >= sum(map(len, records)) - head - len(records) * max(cuts)

    reference = _trace([whole_requests], [whole_responses])  # read whole, walked to cut
    assert _trace(sent.events, received.events) == reference  # walked again by the trace
    assert _trace(sent.events, received.events, told) == reference  # cut where told
    assert len(told[0]) == 1 and len(told[1]) == 1  # the Produce request, the Fetch answer
    # The request's header goes with its spans, as the relay read it: the trace reads
    # neither the header nor the acks again.
    assert told[0][0][3] == (parse_request_header(request_stream), produced.acks != 0)
    assert told[1][0][3] is None


def test_a_frame_cut_short_by_unread_bytes_outside_records_breaks_only_its_trace() -> None:
    """Bytes reported unread where the trace expects a header (a relay bug) stop the trace
    with a reason; nothing is written for them and nothing raises."""
    trace = ConnectionTrace(CLIENT, SERVER)
    assert trace.unread_from_client(10) == []
    assert trace.broken is not None and "outside a frame's body" in trace.broken
