"""Bytes the tunnel need not read (record batches in Produce requests and Fetch answers)
move by splice(2), kernel to kernel. Large messages arrive intact either way, spliced or
read and written, through a forward process's pipes (exec) and through sockets (direct),
on both event loops; the metrics say which way they went. A recording without payloads
splices as much (it writes record sets null); one with payloads reads every byte."""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import subprocess
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest

from kafkatunnel.demo import TANSU_HOST, LocalCluster, free_port, free_port_run
from kafkatunnel.demo.harness import start_tansu
from kafkatunnel.tunnel import DirectForwarder, ExecForwarder, Forwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel
from kafkatunnel.tunnel.relay import ZERO_COPY
from kafkatunnel.verify.calls import FileDecoder

VALUE = 256 << 10
COUNT = 40  # 10 MiB each way
# What librdkafka's mock broker keeps of one partition: past it, it drops the oldest batches
# (log start moves on), and a consumer from the earliest offset never sees them.
MOCK_PARTITION_KEEPS = 5 << 20


@pytest.fixture(scope="module")
def local_tansu() -> Iterator[str]:
    """A tansu broker on this host's loopback, advertising a name only the tunnel maps."""
    port = free_port()
    process = start_tansu(port, f"{TANSU_HOST}:{port}", silent=True)
    yield f"{TANSU_HOST}:{port}"
    process.stop()


def _metric(text: str, name: str) -> int:
    return sum(int(value) for value in re.findall(rf"^{name}{{[^}}]*}} (\d+)$", text, re.M))


def _round_trip(
    bootstrap: str, topic: str | None = None, values: list[bytes] | None = None
) -> list[bytes]:
    """Produce COUNT random values keyed by their digest (librdkafka), consume them all back
    intact (aiokafka); the values.

    Each partition gets its share in turn, whatever the keys: placed by their hash, one
    draw in about 400 put 20 or more in one partition, past what the mock broker keeps, and
    the consumer waited out its deadline for values no broker had any more."""
    topic = topic or f"zero-copy-{uuid.uuid4().hex[:6]}"
    values = values or [random.randbytes(VALUE) for _ in range(COUNT)]
    partitions = _partitions(bootstrap, topic)
    assert -(-len(values) // partitions) * VALUE < MOCK_PARTITION_KEEPS, partitions
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    failed: list[object] = []
    for index, value in enumerate(values):
        producer.produce(
            topic,
            value,
            key=hashlib.sha256(value).digest(),
            partition=index % partitions,
            on_delivery=lambda error, _: failed.append(error) if error else None,
        )
    assert producer.flush(60) == 0
    assert failed == []

    seen = asyncio.run(_consume(bootstrap, topic, len(values)))
    assert sorted(seen) == sorted(hashlib.sha256(v).digest() for v in values)
    return values


def _partitions(bootstrap: str, topic: str) -> int:
    """How many partitions the topic has (asking for it creates it)."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    count = len(producer.list_topics(topic, timeout=30).topics[topic].partitions)
    assert count, f"{topic} has no partitions"
    return count


def _keyed_to_one_partition(partitions: int) -> list[bytes]:
    """COUNT random values whose keys (their digests) librdkafka's default partitioner
    (consistent_random: the key's CRC-32) would all send to partition 0."""
    values: list[bytes] = []
    while len(values) < COUNT:
        value = random.randbytes(VALUE)
        if zlib.crc32(hashlib.sha256(value).digest()) % partitions == 0:
            values.append(value)
    return values


def _consume_librdkafka(bootstrap: str, topic: str) -> None:
    """librdkafka fetches at v16 and up: answers that can name brokers, walked as they pass."""
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest",
         # tansu holds a JoinGroup for half the session timeout: 3 s, not 22
         "session.timeout.ms": 6000}
    )  # fmt: skip
    consumer.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + 60
    try:
        while seen < COUNT and time.monotonic() < deadline:
            for message in consumer.consume(COUNT, 0.5):
                assert message.error() is None, message.error()
                value = message.value()
                assert value is not None and hashlib.sha256(value).digest() == message.key()
                seen += 1
    finally:
        consumer.close()
    assert seen == COUNT


async def _consume(bootstrap: str, topic: str, count: int = COUNT) -> list[bytes]:
    """aiokafka's Fetch versions carry no broker address: their answers pass unread."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    seen: list[bytes] = []
    try:
        async with asyncio.timeout(60):
            while len(seen) < count:
                batch = await consumer.getmany(timeout_ms=500)
                for message in (m for records in batch.values() for m in records):
                    assert message.value is not None and message.key is not None
                    assert hashlib.sha256(message.value).digest() == message.key
                    seen.append(message.key)
    except TimeoutError:  # say where the rest went: never sent on, or gone from the broker
        partitions = sorted(consumer.assignment())
        starts = await consumer.beginning_offsets(partitions)
        ends = await consumer.end_offsets(partitions)
        logs = ", ".join(f"{tp.partition}: {starts[tp]}..{ends[tp]}" for tp in partitions)
        raise AssertionError(
            f"{len(seen)} of {count} values within 60s; the partitions' logs: {logs}"
        ) from None
    finally:
        await consumer.stop()
    return seen


def _check(tunnel: BackgroundTunnel, zero_copy: bool) -> None:
    _round_trip(tunnel.bootstrap_servers)
    metrics = tunnel.metrics()
    carried = _metric(metrics, "kafkatunnel_client_bytes_total") + _metric(
        metrics, "kafkatunnel_broker_bytes_total"
    )
    spliced = _metric(metrics, "kafkatunnel_spliced_bytes_total")
    assert carried >= 2 * COUNT * VALUE
    if zero_copy:
        assert spliced >= 0.8 * 2 * COUNT * VALUE, (spliced, carried)
    else:
        assert spliced == 0


needs_splice = pytest.mark.skipif(not ZERO_COPY, reason="splice(2) is Linux-only")


@pytest.mark.parametrize(
    "zero_copy", [pytest.param(True, marks=needs_splice), False], ids=["splice", "copy"]
)
@pytest.mark.parametrize("uvloop", [False, True], ids=["asyncio", "uvloop"])
def test_through_exec_pipes(cluster: LocalCluster, zero_copy: bool, uvloop: bool) -> None:
    forwarder = ExecForwarder(cluster.exec_template())
    _with_tunnel(cluster.mock[0].address, forwarder, zero_copy, uvloop)


@pytest.mark.parametrize(
    "zero_copy", [pytest.param(True, marks=needs_splice), False], ids=["splice", "copy"]
)
@pytest.mark.parametrize("uvloop", [False, True], ids=["asyncio", "uvloop"])
def test_through_sockets(local_tansu: str, zero_copy: bool, uvloop: bool) -> None:
    port = int(local_tansu.rsplit(":", 1)[1])
    forwarder = DirectForwarder({(TANSU_HOST, port): ("127.0.0.1", port)})
    _with_tunnel(local_tansu, forwarder, zero_copy, uvloop)


def test_values_whose_keys_share_a_partition_all_come_back(cluster: LocalCluster) -> None:
    """Keyed by their digests, these values would all go to one partition: twice what the
    mock broker keeps of one, so half of them would be gone before the consumer came."""
    config = TunnelConfig(
        bootstrap=cluster.mock[0].address, listen_port=free_port_run(8), control=False
    )
    with BackgroundTunnel(config, ExecForwarder(cluster.exec_template())) as tunnel:
        topic = f"one-partition-{uuid.uuid4().hex[:6]}"
        values = _keyed_to_one_partition(_partitions(tunnel.bootstrap_servers, topic))
        assert len(values) * VALUE > MOCK_PARTITION_KEEPS
        _round_trip(tunnel.bootstrap_servers, topic, values)


def _with_tunnel(bootstrap: str, forwarder: Forwarder, zero_copy: bool, uvloop: bool) -> None:
    config = TunnelConfig(
        bootstrap=bootstrap, listen_port=free_port_run(8), control=False, zero_copy=zero_copy
    )
    with BackgroundTunnel(config, forwarder, uvloop=uvloop) as tunnel:
        _check(tunnel, zero_copy)


@needs_splice
@pytest.mark.parametrize("payloads", [False, True], ids=["records-cut", "payloads"])
def test_a_recording_splices_the_record_data_it_does_not_keep(
    local_tansu: str, tmp_path: Path, payloads: bool
) -> None:
    port = int(local_tansu.rsplit(":", 1)[1])
    forwarder = DirectForwarder({(TANSU_HOST, port): ("127.0.0.1", port)})
    config = TunnelConfig(
        bootstrap=local_tansu,
        listen_port=free_port_run(8),
        control=False,
        record_dir=tmp_path,
        record_payloads=payloads,
    )
    topic = f"recorded-{uuid.uuid4().hex[:6]}"
    with BackgroundTunnel(config, forwarder) as tunnel:
        values = _round_trip(tunnel.bootstrap_servers, topic)  # Fetch v11 (aiokafka)
        _consume_librdkafka(tunnel.bootstrap_servers, topic)  # Fetch v16+
        asyncio.run(_produce_aiokafka(tunnel.bootstrap_servers, topic))  # Produce v8
        spliced = _metric(tunnel.metrics(), "kafkatunnel_spliced_bytes_total")
        ports = [int(e.local.rsplit(":", 1)[1]) for e in tunnel.tunnel.endpoints()]
    if payloads:
        assert spliced == 0
    else:  # produced once, fetched twice
        assert spliced >= 0.8 * 3 * COUNT * VALUE, spliced

    files = sorted(tmp_path.iterdir())
    data = b"".join(path.read_bytes() for path in files)
    assert (values[0][1000:1100] in data) is payloads
    frames = []
    for path in files:
        decoder = FileDecoder(str(path), path.read_bytes(), log_frames=True).run()
        assert decoder.summary.problems == []
        frames += decoder.frame_log or []
    produced = sum(1 for key, _, request in frames if key == 0 and request)
    fetched = sum(1 for key, _, request in frames if key == 1 and not request)
    assert produced >= 1 and fetched >= 2
    # Wireshark's own Kafka dissector (4.0 knows Produce to v8, Fetch to v11: aiokafka's)
    # reads every Fetch answer of those versions without a complaint, and every Produce
    # request up to its record set: of one that is not a record batch (cut), it complains.
    decode = [f"-dtcp.port=={p},kafka" for p in ports]
    fetched_ok = produced_named = 0
    for path in files:
        for line in _tshark(path, decode, "kafka.api_key == 1 && kafka.api_version <= 11"):
            assert line.split("\t")[2] in ("", "Request missing"), line  # rotation: ok
            fetched_ok += 1
        produced_named += len(
            _tshark(
                path, decode, "kafka.api_key == 0 && kafka.api_version <= 8 && kafka.topic_name"
            )
        )
    assert fetched_ok >= 2 and produced_named >= 3


def _tshark(path: Path, decode: list[str], where: str) -> list[str]:
    return subprocess.run(
        ["tshark", "-r", str(path), *decode, "-Y", where, "-T", "fields",
         "-e", "kafka.api_key", "-e", "kafka.api_version", "-e", "_ws.expert.message"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout.splitlines()  # fmt: skip


async def _produce_aiokafka(bootstrap: str, topic: str) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for _ in range(3):
            await producer.send_and_wait(topic, random.randbytes(VALUE))
    finally:
        await producer.stop()
