"""Benchmark the sans-I/O rewriter; optionally run the protocol fuzzer at scale.

    .venv/bin/python scripts/bench_protocol.py            # timings, side by side
    .venv/bin/python scripts/bench_protocol.py --fuzz 100000

Timings are medians of repeated runs in one process, each next to the same work done by kio
(full decode + re-encode), so the ratio holds on a noisy machine.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import io
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import response as _fetch12
from kio.schema.fetch.v16 import response as _fetch16
from kio.schema.metadata.v12 import response as _metadata12
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32Timedelta

from kafkatunnel.protocol import BrokerAddress, frame, rewrite_response

# kio's constructors take phantom types (i32, BrokerId...); plain ints are what they hold.
fetch12: Any = _fetch12
fetch16: Any = _fetch16
metadata12: Any = _metadata12

NO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))


def encode(entity: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


def response(body: bytes, flexible: bool = True) -> bytes:
    return frame(b"\x00\x00\x00\x07" + (b"\x00" if flexible else b"") + body)


def metadata(brokers: int, partitions: int, topics: int = 100) -> bytes:
    per_topic = max(partitions // topics, 1)
    message = metadata12.MetadataResponse(
        throttle_time=NO_THROTTLE,
        brokers=tuple(
            metadata12.MetadataResponseBroker(
                node_id=n,
                host=f"kafka-{n}.kafka-headless.prod.svc.cluster.local",
                port=9092,
                rack=None,
            )
            for n in range(brokers)
        ),
        cluster_id="cluster",
        controller_id=0,
        topics=tuple(
            metadata12.MetadataResponseTopic(
                error_code=ErrorCode.none,
                name=f"topic-{t}",
                topic_id=uuid.UUID(int=t + 1),
                partitions=tuple(
                    metadata12.MetadataResponsePartition(
                        error_code=ErrorCode.none,
                        partition_index=p,
                        leader_id=p % brokers,
                        leader_epoch=1,
                        replica_nodes=(p % brokers,),
                        isr_nodes=(p % brokers,),
                        offline_replicas=(),
                    )
                    for p in range(per_topic)
                ),
            )
            for t in range(topics)
        ),
    )
    return response(encode(message))


def fetch(version: int, size: int, partitions: int = 4) -> bytes:
    """A Fetch response carrying `size` bytes of records (v12 names topics, v16 topic ids)."""
    schema = fetch12 if version == 12 else fetch16
    topic = {"topic": "t"} if version == 12 else {"topic_id": uuid.UUID(int=1)}
    parts = tuple(
        schema.PartitionData(
            partition_index=p,
            error_code=ErrorCode.none,
            high_watermark=1,
            records=b"\x00" * (size // partitions),
            aborted_transactions=(),
        )
        for p in range(partitions)
    )
    message = schema.FetchResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        session_id=1,
        responses=(schema.FetchableTopicResponse(partitions=parts, **topic),),
    )
    return response(encode(message))


def to_tunnel(address: BrokerAddress) -> tuple[str, int]:
    return ("127.0.0.1", 9093 + address.node_id)


def median_ms(fn: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(samples)


def kio_roundtrip(wire: bytes) -> None:
    value, _ = entity_reader(metadata12.MetadataResponse)(wire[9:], 0)
    encode(value)


def bench(rounds: int) -> None:
    print("## Metadata v12 rewrite (median ms)\n")
    print("| brokers | partitions | bytes | kafkatunnel rewrite | kio decode+encode | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for brokers, partitions in [(3, 1_000), (3, 10_000), (3, 100_000), (30, 10_000), (300, 10_000)]:
        wire = metadata(brokers, partitions)
        ours = median_ms(functools.partial(rewrite_response, wire, 3, 12, to_tunnel), rounds)
        theirs = median_ms(functools.partial(kio_roundtrip, wire), max(3, rounds // 20))
        row = [f"{brokers}", f"{partitions:,}", f"{len(wire):,}", f"{ours:.3f}", f"{theirs:.1f}"]
        print("| " + " | ".join([*row, f"{theirs / ours:,.0f}x"]) + " |")

    print("\n## Fetch response of 1 MiB of records, no node endpoints (median ms)\n")
    print("| version | what the tunnel does | time | same object passed on |")
    print("| --- | --- | ---: | --- |")
    for version, what in [
        (12, "no address possible: not parsed"),
        (16, "walk to the tagged fields, records skipped"),
    ]:
        wire = fetch(version, 1 << 20)
        ours = median_ms(functools.partial(rewrite_response, wire, 1, version, to_tunnel), rounds)
        same = rewrite_response(wire, 1, version, to_tunnel).frame is wire
        print(f"| v{version} | {what} | {ours:.4f} | {same} |")


def fuzz(cases: int) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.protocol.fuzz import exercise

    count = 0

    @settings(
        max_examples=cases, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(data=st.binary(max_size=300), target=st.integers(0, 10_000), chunk=st.integers(1, 64))
    def run(data: bytes, target: int, chunk: int) -> None:
        nonlocal count
        count += 1
        exercise(data, target, chunk)

    start = time.monotonic()
    run()
    print(f"fuzz: {count:,} cases, only ProtocolError raised, {time.monotonic() - start:.0f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--fuzz", type=int, default=0, help="run this many fuzz cases")
    args = parser.parse_args()
    if args.fuzz:
        fuzz(args.fuzz)
    else:
        bench(args.rounds)


if __name__ == "__main__":
    main()
