"""Round trips of large messages through the tunnel, again and again, the way
tests/tunnel/test_zero_copy.py::test_through_exec_pipes runs one: librdkafka produces 40
values of 256 KiB, aiokafka consumes them, through an `exec` forward (socat) per broker,
uvloop and splice by default. Each trip gets a fresh tunnel. A trip that does not finish
in time is a stall: the script prints what the consumer has (position, log start and end
of each partition), every Pump's state (what it watches, what it holds, what its
descriptors hold) and the kernel's view of the sockets, then stops.

    .venv/bin/python scripts/soak_zero_copy_exec.py [--trips 300] [--loop asyncio]
        [--copy] [--deadline 60] [--keyed] [--netns]

The brokers (a librdkafka mock cluster) run on this host's loopback, not in a network
namespace (no root, nothing shared with other tests), unless --netns asks for the tests'
own set-up (take the tests' heavy lock then). Run it beside a CPU load (`stress-ng --cpu
2`, a second suite) to give the relay the timing of a busy laptop.

--keyed places values by their keys' hash, as the test once did: about one trip in 400
then puts 20 or more values (over 5 MiB) in one partition, the mock broker drops that
partition's oldest batch, and the consumer waits for values no broker has: the stall the
test showed (the dump says so: that partition's log no longer starts at 0). Set
SOAK_HOLD=SECONDS to keep a stalled process for py-spy, gdb or /proc.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import fcntl
import hashlib
import os
import random
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import confluent_kafka

from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.tunnel import ExecForwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel

VALUE = 256 << 10
COUNT = 40


def _queued(fd: int) -> str:
    """Bytes waiting to be read on fd (FIONREAD), or why not known."""
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf, True)
    except OSError as error:
        return f"? ({error.strerror})"
    return str(buf[0])


def _state(tunnel: BackgroundTunnel) -> str:
    """Every connection's Pumps, as the tunnel's loop sees them."""

    async def snapshot() -> str:
        lines = []
        for connection in tunnel.tunnel.connections:
            lines.append(f"connection {connection.endpoint.local} <- {connection.peer}")
            for name, pump in zip(("requests", "responses"), connection.pumps, strict=False):
                pipe = pump._pipe
                lines.append(
                    f"  {name}: reading={pump._reading} writing={pump._writing} "
                    f"stopped={pump._stopped} short={pump._short} in_pipe={pump._in_pipe} "
                    f"pipe_queued={_queued(pipe.read_end) if pipe else '-'} "
                    f"out={sum(len(c) for c in pump._out)} "
                    f"unread={pump.direction.unread} awaited={pump.direction.awaited} "
                    f"source_fd={pump.source.read_fd} queued={_queued(pump.source.read_fd)} "
                    f"sink_fd={pump.sink.write_fd} "
                    f"watched={sorted(pump.source._registered)}/{sorted(pump.sink._registered)}"
                )
        return "\n".join(lines) or "no connections"

    return tunnel.call(snapshot(), timeout=10)


def _sockets() -> str:
    """This process's and socat's TCP sockets as the kernel sees them (queues, windows)."""
    ss = subprocess.run(
        ["ss", "-tnpi", "state", "established"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    mine = f"pid={os.getpid()},"
    lines = ss[:1]
    for index in range(1, len(ss) - 1):
        if mine in ss[index] or '"socat"' in ss[index]:
            lines += ss[index : index + 2]
    return "\n".join(lines)


async def _consume(
    bootstrap: str, topic: str, deadline: float, on_stall: Callable[[str], None]
) -> int:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    seen = 0
    try:
        while seen < COUNT and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for message in (m for records in batch.values() for m in records):
                assert message.value is not None and message.key is not None
                assert hashlib.sha256(message.value).digest() == message.key
                seen += 1
        if seen < COUNT:  # before the consumer lets go of its connections
            partitions = sorted(consumer.assignment())
            starts = await consumer.beginning_offsets(partitions)
            ends = await consumer.end_offsets(partitions)
            where = [
                f"{tp.partition}: position {await consumer.position(tp)}, "
                f"log {starts[tp]}..{ends[tp]}"
                for tp in partitions
            ]
            on_stall(f"aiokafka has {seen}: " + "; ".join(where))
    finally:
        await consumer.stop()
    return seen


def _trip(tunnel: BackgroundTunnel, deadline: float, keyed: bool) -> str | None:
    """One round trip; None, or what stalled."""
    bootstrap = tunnel.bootstrap_servers
    topic = f"soak-{uuid.uuid4().hex[:6]}"
    values = [random.randbytes(VALUE) for _ in range(COUNT)]
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    partitions = len(producer.list_topics(topic, timeout=30).topics[topic].partitions)
    failed: list[object] = []
    for index, value in enumerate(values):
        producer.produce(
            topic,
            value,
            key=hashlib.sha256(value).digest(),
            partition=-1 if keyed else index % partitions,  # -1: librdkafka's partitioner
            on_delivery=lambda error, _: failed.append(error) if error else None,
        )
    left = producer.flush(max(1.0, deadline - time.monotonic()))
    if left or failed:
        return f"produce: {left} messages undelivered, {failed} failed"

    def on_stall(consumer: str) -> None:
        print(consumer, _state(tunnel), _sockets(), sep="\n", flush=True)
        if os.environ.get("SOAK_HOLD"):
            print(f"holding (SOAK_HOLD): attach to pid {os.getpid()} now", flush=True)
            time.sleep(float(os.environ["SOAK_HOLD"]))

    seen = asyncio.run(_consume(bootstrap, topic, deadline, on_stall))
    return None if seen == COUNT else f"consume: {seen} of {COUNT} values"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trips", type=int, default=300)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--copy", action="store_true", help="read and write every byte")
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds per trip")
    parser.add_argument(
        "--keyed", action="store_true", help="place values by their keys' hash (see above)"
    )
    parser.add_argument(
        "--per-cluster", type=int, default=50, help="trips per mock cluster (it keeps every byte)"
    )
    parser.add_argument(
        "--netns", action="store_true", help="brokers in a network namespace, as the tests run"
    )
    args = parser.parse_args()

    started = time.monotonic()
    for first in range(1, args.trips + 1, args.per_cluster):
        trips = range(first, min(first + args.per_cluster, args.trips + 1))
        with LocalCluster(isolate=args.netns, tansu=False) as cluster:
            _trips(cluster, trips, args)
    print(f"{args.trips} trips, no stall, {time.monotonic() - started:.0f}s")


def _trips(cluster: LocalCluster, trips: range, args: argparse.Namespace) -> None:
    forwarder = ExecForwarder(cluster.exec_template())
    for trip in trips:
        config = TunnelConfig(
            bootstrap=cluster.mock[0].address,
            listen_port=free_port_run(8),
            control=False,
            zero_copy=not args.copy,
        )
        with BackgroundTunnel(config, forwarder, uvloop=args.loop == "uvloop") as tunnel:
            begun = time.monotonic()
            stalled = _trip(tunnel, begun + args.deadline, args.keyed)
            took = time.monotonic() - begun
            if stalled:
                print(f"trip {trip}: STALLED after {took:.1f}s: {stalled}", flush=True)
                raise SystemExit(1)
        print(f"trip {trip}: {took:.2f}s", flush=True)


if __name__ == "__main__":
    main()
