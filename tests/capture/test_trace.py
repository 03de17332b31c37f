"""A connection's trace as written by the recorder, read back by our reader and by tshark:
consistent TCP (no gaps or retransmissions in tshark's analysis), whole frames, rotation,
and nothing kept of requests the tunnel cannot read."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v3.response import FindCoordinatorResponse
from kio.schema.produce.v8.request import PartitionProduceData, ProduceRequest, TopicProduceData

from kafkatunnel.capture.recorder import Listener, Recorder
from kafkatunnel.verify.calls import FileDecoder
from tests.kio_messages import (
    api_versions_answer,
    api_versions_v5,
    encode,
    request_frame,
    response_frame,
)

pytestmark = pytest.mark.quick

REBOOTSTRAP_REQUIRED = 129  # the error a broker gives a client that meant another (KIP-1242)
LISTENER = Listener(2, "kafka-1.kafka-headless.shop.svc.cluster.local:9092", "127.0.0.1:19094")
CLIENT, SERVER = ("127.0.0.1", 40001), ("127.0.0.1", 19094)


def _lookup(correlation: int) -> tuple[bytes, bytes]:
    """FindCoordinator v3: a version the tshark of Debian 12 decodes."""
    request = request_frame(FindCoordinatorRequest(key="g", key_type=0), correlation)  # type: ignore[arg-type]
    answer = FindCoordinatorResponse(
        throttle_time=timedelta(0),  # type: ignore[arg-type]
        error_code=ErrorCode.none,
        error_message=None,
        node_id=2,  # type: ignore[arg-type]
        host="127.0.0.1",
        port=19094,  # type: ignore[arg-type]
    )
    return request, response_frame(10, 3, encode(answer), correlation)


def _big_produce(correlation: int, size: int) -> bytes:
    data = PartitionProduceData(index=0, records=b"r" * size)  # type: ignore[arg-type]
    request = ProduceRequest(
        transactional_id=None, acks=1, timeout=timedelta(seconds=1),  # type: ignore[arg-type]
        topic_data=(TopicProduceData(name="t", partition_data=(data,)),),  # type: ignore[arg-type]
    )  # fmt: skip
    return request_frame(request, correlation)


def _record(tmp_path: Path, rotate: int = 1 << 30, payloads: bool = False) -> Recorder:
    recorder = Recorder(tmp_path, rotate_bytes=rotate, payloads=payloads)
    recording = recorder.connection(LISTENER, CLIENT, SERVER)
    for correlation in range(1, 6):
        request, response = _lookup(correlation)
        recording.from_client([request[:7], memoryview(request)[7:]])  # any chunking
        recording.to_client([response])
    recording.from_client([_big_produce(6, 200_000)])
    raw_token = (21).to_bytes(4, "big") + b"\x00alice\x00s3cr3t-pass!"
    recording.from_client([raw_token])
    recording.closed()
    recorder.close()
    return recorder


def test_the_trace_reads_back_as_the_calls_that_passed(tmp_path: Path) -> None:
    recorder = _record(tmp_path, payloads=True)
    (path,) = recorder.files
    decoder = FileDecoder(str(path), path.read_bytes(), log_frames=True).run()
    assert decoder.frame_log == [
        *[(10, c, r) for c in range(1, 6) for r in (True, False)],
        (0, 6, True),  # 200 kB in four segments, reassembled
    ]
    answered = [c for c in decoder.calls if c.response_ts is not None]
    assert [c.correlation_id for c in answered] == [1, 2, 3, 4, 5]
    assert {c.conn.node for c in decoder.calls} == {2}
    assert decoder.summary.problems == []
    data = path.read_bytes()
    assert b"s3cr3t-pass" not in data and b"alice" not in data  # an unreadable request
    assert data.count(b"r" * 60_000) == 3  # payloads were asked for: kept, 65,000 a segment


def test_record_data_is_cut_unless_asked(tmp_path: Path) -> None:
    (path,) = _record(tmp_path).files
    assert b"r" * 1000 not in path.read_bytes()


def test_rotation_starts_files_that_stand_alone(tmp_path: Path) -> None:
    recorder = _record(tmp_path, rotate=600)
    assert len(recorder.files) > 3
    for path in recorder.files:
        decoder = FileDecoder(str(path), path.read_bytes()).run()
        assert decoder.summary.listeners[0]["node_id"] == 2  # every file names its brokers
        assert decoder.summary.problems == []


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_tshark_sees_consistent_tcp_and_kafka(tmp_path: Path) -> None:
    (path,) = _record(tmp_path).files
    problems = subprocess.run(
        ["tshark", "-r", str(path), "-Y", "tcp.analysis.flags && !tcp.analysis.window_update"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert problems == ""
    info = subprocess.run(
        ["tshark", "-r", str(path), "-d", "tcp.port==19094,kafka", "-Y", "kafka",
         "-T", "fields", "-e", "kafka.api_key"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert info == ["10"] * 10 + ["0"]  # requests and answers, all matched


def test_a_recording_that_cannot_be_written_stops_quietly(tmp_path: Path) -> None:
    """Every write fails with ENOSPC (/dev/full): the recording stops and says so; the
    connection's calls return as usual."""
    recorder = Recorder(tmp_path, opener=lambda _: open("/dev/full", "wb", buffering=0))  # noqa: SIM115
    recording = recorder.connection(LISTENER, CLIENT, SERVER)
    request, response = _lookup(1)
    recording.from_client([request])  # no exception reaches the connection
    recording.to_client([response])
    assert recorder.sync()
    assert recorder.failed is not None and "No space left on device" in recorder.failed
    recording.from_client([request])  # nor after it stopped
    recorder.close()


def test_a_stalled_disk_never_holds_up_a_connection(tmp_path: Path) -> None:
    """The recording's file is a pipe nobody reads: its writer blocks for good. The
    connection's calls keep returning; once the disk is a set backlog behind, the recording
    stops and says why, and holds no more."""
    read_end, write_end = os.pipe()
    recorder = Recorder(
        tmp_path,
        payloads=True,
        backlog_bytes=1 << 20,
        opener=lambda _: os.fdopen(write_end, "wb", buffering=0),
    )
    recording = recorder.connection(LISTENER, CLIENT, SERVER)
    big = _big_produce(1, 60_000)

    def traffic() -> None:  # 6 MB of frames kept whole, the pipe takes 64 KiB
        for _ in range(100):
            recording.from_client([big])

    runner = threading.Thread(target=traffic)
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "a recording call blocked on a stalled disk"
    assert recorder.failed is not None and "fell" in recorder.failed, recorder.failed
    assert recorder.backlog < (1 << 20) + len(big) + 1000  # it stopped queueing there
    os.close(read_end)  # the writer's write now fails (EPIPE) and it ends
    recorder.close()
    assert not recorder._writer.is_alive()


def _raw(token: bytes) -> bytes:
    return len(token).to_bytes(4, "big") + token


@pytest.mark.parametrize(
    ("mechanism", "client_tokens", "server_tokens"),
    [
        # PLAIN: the password in one token, answered by an empty frame. This token reads
        # as an ApiVersions v0 request header: it is skipped for where it is, not its look.
        ("PLAIN", [b"\x00\x12\x00\x00\x00\x00\x00\x07\x00s3cr3t-pw"], [b""]),
        (
            "SCRAM-SHA-256",
            [b"n,,n=alice,r=s3cr3t-nonce", b"c=biws,r=s3cr3t-nonce,p=s3cr3t-proof"],
            [b"r=s3cr3t-nonce,s=s3cr3t-salt,i=4096", b"v=s3cr3t-verifier"],
        ),
    ],
)
def test_legacy_sasl_tokens_never_reach_a_recording(
    mechanism: str, client_tokens: list[bytes], server_tokens: list[bytes]
) -> None:
    """After a SaslHandshake v0 the tokens are raw, unframed by Kafka's headers: none of
    them is written, in either direction, and the Kafka requests after them are."""
    from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest
    from kio.schema.sasl_handshake.v0.response import SaslHandshakeResponse

    from kafkatunnel.capture.trace import ConnectionTrace

    trace = ConnectionTrace(("127.0.0.1", 40000), ("127.0.0.1", 9092))
    written = trace.from_client([request_frame(SaslHandshakeRequest(mechanism=mechanism), 1)])
    answer = SaslHandshakeResponse(error_code=ErrorCode.none, mechanisms=(mechanism,))
    written += trace.to_client([response_frame(17, 0, encode(answer), 1)])
    for client, server in zip(client_tokens, server_tokens, strict=True):
        written += trace.from_client([_raw(client)])
        written += trace.to_client([_raw(server)])
    after, answered = _lookup(5)
    written += trace.from_client([after]) + trace.to_client([answered])
    data = b"".join(written)
    assert b"s3cr3t" not in data and trace.broken is None
    assert after[4:] in data and answered[4:] in data  # Kafka again once the tokens are done


def test_an_api_versions_newer_than_kio_is_recorded_and_shows_the_node_meant(
    tmp_path: Path,
) -> None:
    """Kafka 4.4's clients open with ApiVersions v5 (KIP-1242), naming the node they mean;
    a broker that is not it answers REBOOTSTRAP_REQUIRED. kio's schemas end at v4, yet the
    recording keeps both (ApiVersions is flexible from v3 on, at every version), so verify
    sees the connection reached another broker."""
    from kafkatunnel.verify.events import MISDIRECTED, events_of

    recorder = Recorder(tmp_path)
    recording = recorder.connection(LISTENER, CLIENT, SERVER)
    recording.from_client([api_versions_v5(2, correlation_id=1)])
    recording.to_client([api_versions_answer(REBOOTSTRAP_REQUIRED, correlation_id=1)])
    recording.closed()
    recorder.close()
    (path,) = recorder.files
    decoder = FileDecoder(str(path), path.read_bytes()).run()
    assert decoder.summary.problems == []
    (call,) = decoder.calls
    (event,) = [e for e in events_of(call) if e.kind == MISDIRECTED]
    assert (event.node, call.conn.node) == (2, 2)
