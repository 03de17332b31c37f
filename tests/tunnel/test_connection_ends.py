"""How a client's connection ends, through a real tunnel to the isolated cluster, on both
event loops, spliced and copied: a client that ends its sending (shutdown(SHUT_WR), as
`nc -N` does) still gets the answers to what it sent, and then the end; one whose answers
do not come is let go after HALF_CLOSED; a client's whole request ahead of its garbage
still reaches the broker; a closing client's last requests still reach the broker; a
client of --client-tls gets close_notify at the end."""

from __future__ import annotations

import datetime
import socket
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder  # type: ignore[import-untyped]
from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.workload import produce
from kafkatunnel.hostnames import split_address
from kafkatunnel.protocol import FrameDecoder
from kafkatunnel.tunnel import ExecForwarder, TunnelConfig
from kafkatunnel.tunnel import proxy as proxy_module
from kafkatunnel.tunnel.background import BackgroundTunnel
from kafkatunnel.tunnel.relay import ZERO_COPY
from kafkatunnel.tunnel.tls import listener_tls
from kafkatunnel.waiting import wait_for
from tests.kio_messages import request_frame
from tests.tunnel.test_learning import ask
from tests.tunnel.test_stalled_client import api_versions

LOOPS = pytest.mark.parametrize("uvloop", [False, True], ids=["asyncio", "uvloop"])
COPIES = pytest.mark.parametrize(
    "zero_copy",
    [pytest.param(True, marks=pytest.mark.skipif(not ZERO_COPY, reason="Linux")), False],
    ids=["splice", "copy"],
)


@pytest.fixture
def tunnel(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[BackgroundTunnel]:
    """A tunnel on the event loop and relay mode the test is parametrized with."""
    callspec = getattr(request.node, "callspec", None)
    params = {} if callspec is None else callspec.params
    config = TunnelConfig(
        bootstrap=cluster.mock[0].address,
        listen_port=free_port_run(8),
        control=False,
        zero_copy=params.get("zero_copy", True),
    )
    template = cluster.exec_template()
    if params.get("slow_forward"):  # connects as `ssh bastion nc ...` does: not at once
        template = f'sh -c \'sleep {SLOW_FORWARD} && exec "$0" "$@"\' {template}'
    forwarder = ExecForwarder(template)
    with BackgroundTunnel(config, forwarder, uvloop=params.get("uvloop", False)) as running:
        yield running


def answers_until_the_end(sock: socket.socket, within: float) -> list[int]:
    """The correlation ids of the answers that come before the tunnel ends the connection
    (which it must do within `within` seconds)."""
    decoder = FrameDecoder(max_frame_size=1 << 20)
    answered: list[int] = []
    sock.settimeout(within)
    while data := sock.recv(1 << 16):
        answered.extend(int.from_bytes(f[4:8], "big") for f in decoder.feed(data))
    decoder.close()  # nothing cut short
    return answered


@pytest.mark.alone  # a bound on elapsed time
@LOOPS
@COPIES
def test_a_client_that_ends_its_sending_gets_every_answer_then_the_end(
    tunnel: BackgroundTunnel, uvloop: bool, zero_copy: bool
) -> None:
    with socket.create_connection(split_address(tunnel.bootstrap_servers)) as sock:
        sock.sendall(api_versions(1) + ask(2))
        sock.shutdown(socket.SHUT_WR)
        started = time.monotonic()
        assert answers_until_the_end(sock, within=10) == [1, 2]
    assert time.monotonic() - started < proxy_module.HALF_CLOSED / 3  # ended at the answer
    assert tunnel.status()["endpoints"][0]["errors"] == 0


def test_a_half_closed_client_whose_answer_does_not_come_is_let_go_after_the_deadline(
    tunnel: BackgroundTunnel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Fetch at the end of an empty partition is answered after its max wait (20 s here);
    the tunnel lets the client go at HALF_CLOSED (1 s here), without the answer."""
    monkeypatch.setattr(proxy_module, "HALF_CLOSED", 1.0)
    topic = f"half-closed-{uuid.uuid4().hex[:6]}"
    assert produce(tunnel.bootstrap_servers, topic, 1, partition=0) == 1
    leader = _leader(tunnel.bootstrap_servers, topic)
    request: Any = FetchRequest  # kio's NewTypes are for its own encoders
    partition: Any = FetchPartition
    fetch = request(
        max_wait=datetime.timedelta(seconds=20),
        min_bytes=1,
        topics=(
            FetchTopic(
                topic=topic,  # type: ignore[arg-type]
                partitions=(partition(partition=0, fetch_offset=1, partition_max_bytes=1 << 20),),
            ),
        ),
    )
    with socket.create_connection(leader) as sock:
        sock.sendall(request_frame(fetch, 5))
        sock.shutdown(socket.SHUT_WR)
        started = time.monotonic()
        assert answers_until_the_end(sock, within=15) == []
    assert 0.9 < time.monotonic() - started < 10


def _leader(bootstrap: str, topic: str) -> tuple[str, int]:
    """The tunnel's address of the leader of the topic's partition 0."""
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic, timeout=10)
    broker = metadata.brokers[metadata.topics[topic].partitions[0].leader]
    assert broker.host is not None
    return broker.host, broker.port


def produce_request(topic: str, value: bytes, acks: int) -> bytes:
    """A Produce request of one record to partition 0 (kafka-python's record batch)."""
    batch = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                      producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                      batch_size=1 << 20)  # fmt: skip
    batch.append(0, timestamp=None, key=None, value=value, headers=[])
    request: Any = ProduceRequest  # kio's NewTypes are for its own encoders
    data = PartitionProduceData(index=0, records=bytes(batch.build()))  # type: ignore[arg-type]
    return request_frame(
        request(
            transactional_id=None,
            acks=acks,
            timeout=datetime.timedelta(seconds=10),
            topic_data=(TopicProduceData(name=topic, partition_data=(data,)),),  # type: ignore[arg-type]
        ),
        7,
    )


def records_in(bootstrap: str, topic: str) -> int:
    """The high watermark of the topic's partition 0."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": topic})
    try:
        _, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), 10)
    finally:
        consumer.close()
    return int(high)


@LOOPS
@COPIES
def test_a_whole_request_ahead_of_garbage_reaches_the_broker(
    tunnel: BackgroundTunnel, uvloop: bool, zero_copy: bool
) -> None:
    """The client's Produce and its garbage arrive in one read: the record is written, and
    the client's connection ends saying why."""
    topic = f"ahead-of-garbage-{uuid.uuid4().hex[:6]}"
    assert produce(tunnel.bootstrap_servers, topic, 1, partition=0) == 1
    with socket.create_connection(_leader(tunnel.bootstrap_servers, topic)) as sock:
        sock.sendall(
            produce_request(topic, b"ahead", 1) + b"\x00\x00\x00\x06\xff\xff\x00\x00\x00\x01"
        )
        answers_until_the_end(sock, within=10)
    assert records_in(tunnel.bootstrap_servers, topic) == 2
    errors = [e["last_error"] for e in tunnel.status()["endpoints"] if e["last_error"]]
    assert any("invalid Kafka protocol" in error for error in errors), errors


@LOOPS
@COPIES
@pytest.mark.parametrize("acks", [1, 0], ids=["answered", "unanswered"])
@pytest.mark.parametrize("slow_forward", [True], ids=["slow-forward"])
def test_a_closing_clients_last_requests_reach_the_broker(
    tunnel: BackgroundTunnel, uvloop: bool, zero_copy: bool, acks: int, slow_forward: bool
) -> None:
    """Clients send a last request and close at once (a LeaveGroup, a Produce with acks=0),
    through a forward that takes a while to connect: the request waits in the forward's
    stdin meanwhile, and must still reach the broker, answered or not."""
    topic = f"last-words-{uuid.uuid4().hex[:6]}"
    assert produce(tunnel.bootstrap_servers, topic, 1, partition=0) == 1
    leader = _leader(tunnel.bootstrap_servers, topic)
    for index in range(LAST_WORDS):
        with socket.create_connection(leader) as sock:
            sock.sendall(produce_request(topic, b"last %d" % index, acks))
    wait_for(
        lambda: records_in(tunnel.bootstrap_servers, topic) == 1 + LAST_WORDS,
        timeout=20,
        what=f"{LAST_WORDS} last records",
    )


LAST_WORDS = 5
SLOW_FORWARD = 0.3  # seconds the slow forward takes before it reads its stdin


@LOOPS
def test_a_client_of_client_tls_gets_close_notify_at_the_end(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uvloop: bool
) -> None:
    """The tunnel ends a --client-tls client's connection (here for its garbage) with
    close_notify: the client sees a clean end, not a truncation (an EOF that TLS calls an
    attack)."""
    monkeypatch.setenv("KAFKATUNNEL_STATE_DIR", str(tmp_path / "state"))
    config = TunnelConfig(
        bootstrap=cluster.mock[0].address, listen_port=free_port_run(8), control=False,
        client_tls=listener_tls("127.0.0.1"),
    )  # fmt: skip
    forwarder = ExecForwarder(cluster.exec_template())
    with BackgroundTunnel(config, forwarder, uvloop=uvloop) as tunnel:
        context = ssl.create_default_context(cafile=tunnel.status()["client_tls"]["ca"])
        host, port = split_address(tunnel.bootstrap_servers)
        with (
            socket.create_connection((host, port), timeout=10) as plain,
            context.wrap_socket(plain, server_hostname=host, suppress_ragged_eofs=False) as sock,
        ):
            sock.sendall(api_versions(1))
            assert answers_until_answered(sock) == [1]
            sock.sendall(b"\x00\x00\x00\x06\xff\xff\x00\x00\x00\x01")
            assert sock.recv(1 << 16) == b""  # close_notify (SSLEOFError without one)


def answers_until_answered(sock: socket.socket) -> list[int]:
    """The correlation id of the first answer, read whole."""
    decoder = FrameDecoder(max_frame_size=1 << 20)
    while not (frames := decoder.feed(data := sock.recv(1 << 16))):
        assert data, "the connection ended before its answer"
    return [int.from_bytes(f[4:8], "big") for f in frames]
