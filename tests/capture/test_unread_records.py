"""A recording without payloads lets record data pass unread: the Exchange marks only the
bytes inside record sets as unread (Produce requests, Fetch answers of every version), hands
the recording each frame with those runs as counts, and the trace writes exactly the
packets it writes when it read everything. Any chunking, any splicing, every version kio
knows."""

from __future__ import annotations

import dataclasses
import datetime
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.produce.v3 import request as produce_v3
from kio.schema.produce.v9 import request as produce_v9
from kio.static.primitive import i32Timedelta

from kafkatunnel.capture.trace import ConnectionTrace
from kafkatunnel.protocol import (
    REQUEST_HEAD,
    RESPONSE_HEAD,
    BrokerAddress,
    Direction,
    Exchange,
    FramePassed,
    Part,
    known_versions,
    parse_request_header,
    rewrite_caps,
)
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

pytestmark = pytest.mark.quick

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
    frames: list[FramePassed] = field(default_factory=list)  # that passed whole, if observed
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
            seen.frames.extend(direction.skip(size))
            seen.events.append(size)
            seen.unread_spans.append((position, position + size))
            seen.out += stream[position : position + size]
        else:
            size = min(cuts[step % len(cuts)], len(stream) - position)
            fed = direction.feed(stream[position : position + size])
            seen.frames.extend(fed.frames)
            data = b"".join(fed.out)
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
    """The message with every non-empty record set replaced by bytes of a random length
    found in the stream by value: each set starts with a mark of its own (hypothesis'
    one-byte record sets would match headers, and its randomness, shrunk, is all zeros,
    as headers are)."""
    marks = iter(range(1_000_000))

    def unique(field: dataclasses.Field[Any], value: Any) -> Any:
        if field.name == "records" and isinstance(value, bytes):
            if not value:
                return value
            mark = f"<record set {next(marks)}>".encode()
            return mark + rnd.randbytes(rnd.randint(24, 3000))
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


Observed = list[FramePassed]


def _trace_read(requests_in: bytes, responses_in: bytes) -> list[bytes]:
    """The packets a trace writes for the two streams, read whole (cut by walking them)."""
    trace = ConnectionTrace(CLIENT, SERVER)
    packets = trace.from_client([requests_in]) + trace.to_client([responses_in])
    assert trace.broken is None
    return packets


def _trace_observed(requests_in: Observed, responses_in: Observed) -> list[bytes]:
    """The packets a trace writes for the frames an Exchange handed over."""
    trace = ConnectionTrace(CLIENT, SERVER)
    packets: list[bytes] = []
    for frame in requests_in:
        packets += trace.request(*frame)
    for parts, records, _ in responses_in:
        packets += trace.response(parts, records)
    assert trace.broken is None
    return packets


def _unread_in(frames: Observed, stream: bytes) -> list[tuple[int, int]]:
    """Where in the stream each frame's counted runs lie; and each frame's parts are the
    stream's bytes, but for those runs."""
    found = []
    at = 0
    for parts, _, _ in frames:
        for part in parts:
            if isinstance(part, int):
                found.append((at, at + part))
                at += part
            else:
                assert bytes(part) == stream[at : at + len(part)]
                at += len(part)
    assert at == len(stream)
    return found


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
    whole_requests = b"".join(reading.requests.feed(request_stream).out)
    whole_responses = b"".join(reading.responses.feed(response_stream).out)

    splicing = Exchange(tunnel_mapper, rewrite_caps(), records_only=True)
    splicing.observe()
    sent = drive(splicing.requests, request_stream, cuts)
    received = drive(splicing.responses, response_stream, cuts)
    observed = (sent.frames, received.frames)
    assert bytes(sent.out) == whole_requests == request_stream
    assert received.out == whole_responses

    # Nothing but record data went by unread, and the recording was handed none of it...
    for seen, frames, stream, out, message in (
        (sent, observed[0], request_stream, request_stream, produced),
        (received, observed[1], response_stream, whole_responses, fetched),
    ):  # (a rewritten answer may differ in length: spliced runs are in what came in)
        for spans, runs in (
            (record_spans(stream, _records_of(message)), seen.unread_spans),
            (record_spans(out, _records_of(message)), _unread_in(frames, out)),
        ):
            for start, end in runs:
                assert any(a <= start and end <= b for a, b in spans), (start, end, spans)
    # ...and all of it did, but for what came in the frame's head or in the same piece as
    # the bytes before it (the relay reads at least 16 KiB at a time: so would it).
    for seen, message, head in ((sent, produced, REQUEST_HEAD), (received, fetched, RESPONSE_HEAD)):
        records = _records_of(message)
        unread = sum(e for e in seen.events if isinstance(e, int))
        assert unread >= sum(map(len, records)) - head - len(records) * max(cuts)

    reference = _trace_read(whole_requests, whole_responses)  # read whole, walked to cut
    assert _trace_observed(*observed) == reference  # cut where the Exchange's walk found
    assert len(observed[0]) == 2 and len(observed[1]) == 1 + (produced.acks != 0)
    # Each request's header goes with it, as the relay read it: the trace reads neither
    # the header nor the acks again. The Produce request and the Fetch answer were walked.
    produce, fetch = observed[0]
    assert produce[2] == (parse_request_header(request_stream), produced.acks != 0)
    assert fetch[2] is not None and fetch[2][0].api_key == FETCH
    assert produce[1] is not None and fetch[1] is None
    assert observed[1][-1][1] is not None and observed[1][-1][2] is None


def test_a_count_where_the_walk_found_no_records_keeps_only_the_header() -> None:
    """A frame whose counted runs are not the record sets its walk found (a relay bug) is
    written with its header only (fail closed); the trace goes on, nothing raises."""
    data_produce = _one_partition_produce()
    produce_request = request_frame(data_produce, 7)
    trace = ConnectionTrace(CLIENT, SERVER)
    header = parse_request_header(produce_request)
    assert header.body_offset is not None
    records = _records_of(data_produce)[0]
    at = produce_request.index(records)
    parts: list[Part] = [produce_request[:at], len(records), produce_request[at + len(records) :]]
    right = trace.request(parts, (((at, at + len(records)),), False), (header, True))
    wrong = ConnectionTrace(CLIENT, SERVER).request(
        parts, (((at + 1, at + 1 + len(records)),), False), (header, True)
    )
    assert trace.broken is None and len(right) == len(wrong) == 1
    assert len(wrong[0]) == 40 + header.body_offset  # IP and TCP headers, the Kafka header
    assert len(right[0]) == 40 + len(produce_request) - len(records)


@pytest.mark.parametrize("version", [3, 9])
def test_a_frame_handed_over_without_spans_is_walked_again_around_its_unread_run(
    version: int,
) -> None:
    """A frame whose walk did not reach its end (so no spans) is walked again by the trace:
    record data that passed unread right after its length (a varint of two bytes in v9,
    where the walk asks for five) is cut just as where the spans say."""
    data_produce = _one_partition_produce(produce_v9 if version == 9 else produce_v3)
    produce_request = request_frame(data_produce, 7)
    header = parse_request_header(produce_request)
    records = _records_of(data_produce)[0]
    at = produce_request.index(records)
    parts: list[Part] = [produce_request[:at], len(records), produce_request[at + len(records) :]]
    spans = (((at, at + len(records)),), version == 9)

    walked_again = ConnectionTrace(CLIENT, SERVER).request(parts, None, (header, True))

    assert walked_again == ConnectionTrace(CLIENT, SERVER).request(parts, spans, (header, True))
    shorter = 1 if version == 9 else 0  # an empty set's length: one byte, not two
    assert len(walked_again[0]) == 40 + len(produce_request) - len(records) - shorter


def _one_partition_produce(schema: Any = produce_v3) -> Any:
    """A Produce request (v3: int32 lengths) with one record set of 500 bytes."""
    partition = schema.PartitionProduceData(index=0, records=random.Random(1).randbytes(500))
    topic = schema.TopicProduceData(name="t", partition_data=(partition,))
    return schema.ProduceRequest(
        transactional_id=None,
        acks=1,
        timeout=i32Timedelta.parse(datetime.timedelta(0)),
        topic_data=(topic,),
    )
