"""Bytes the tunnel need not read (record batches in Produce requests and Fetch answers)
move by splice(2), kernel to kernel. Large messages arrive intact either way, spliced or
read and written, through a forward process's pipes (exec) and through sockets (direct),
on both event loops; the metrics say which way they went."""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import uuid
from collections.abc import Iterator

import confluent_kafka
import pytest

from kafkatunnel.localcluster import TANSU_HOST, LocalCluster, free_port, free_port_run
from kafkatunnel.localcluster.harness import start_tansu
from kafkatunnel.tunnel import DirectForwarder, ExecForwarder, Forwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel
from kafkatunnel.tunnel.relay import ZERO_COPY

VALUE = 256 << 10
COUNT = 40  # 10 MiB each way


@pytest.fixture(scope="module")
def local_tansu() -> Iterator[str]:
    """A tansu broker on this host's loopback, advertising a name only the tunnel maps."""
    port = free_port()
    process = start_tansu(port, f"{TANSU_HOST}:{port}", silent=True)
    yield f"{TANSU_HOST}:{port}"
    process.stop()


def _metric(text: str, name: str) -> int:
    return sum(int(value) for value in re.findall(rf"^{name}{{[^}}]*}} (\d+)$", text, re.M))


def _round_trip(bootstrap: str) -> None:
    """Produce COUNT random values keyed by their digest (librdkafka), consume them all back
    intact (aiokafka)."""
    topic = f"zero-copy-{uuid.uuid4().hex[:6]}"
    values = [random.randbytes(VALUE) for _ in range(COUNT)]
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    failed: list[object] = []
    for value in values:
        producer.produce(
            topic,
            value,
            key=hashlib.sha256(value).digest(),
            on_delivery=lambda error, _: failed.append(error) if error else None,
        )
    assert producer.flush(60) == 0
    assert failed == []

    seen = asyncio.run(_consume(bootstrap, topic))
    assert sorted(seen) == sorted(hashlib.sha256(v).digest() for v in values)


async def _consume(bootstrap: str, topic: str) -> list[bytes]:
    """aiokafka's Fetch versions carry no broker address: their answers pass unread."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    seen: list[bytes] = []
    try:
        async with asyncio.timeout(60):
            while len(seen) < COUNT:
                batch = await consumer.getmany(timeout_ms=500)
                for message in (m for records in batch.values() for m in records):
                    assert message.value is not None and message.key is not None
                    assert hashlib.sha256(message.value).digest() == message.key
                    seen.append(message.key)
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


def _with_tunnel(bootstrap: str, forwarder: Forwarder, zero_copy: bool, uvloop: bool) -> None:
    config = TunnelConfig(
        bootstrap=bootstrap, listen_port=free_port_run(8), control_port=None, zero_copy=zero_copy
    )
    with BackgroundTunnel(config, forwarder, uvloop=uvloop) as tunnel:
        _check(tunnel, zero_copy)
