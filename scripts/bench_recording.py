"""What recording costs per Produce request, without sockets: repeatable where the tunnel
bench (bench_tunnel.py) is not.

    .venv/bin/python scripts/bench_recording.py [--requests 300] [--callgrind]

Each request is a 1 MiB Produce v9 (one partition, as librdkafka sends ~1 MB per request
in the tunnel bench) and its answer, fed to the Exchange the way the relay feeds it: a
16 KiB head read, then the unread remainder skipped (spliced) 256 KiB at a time, the
answer read whole. Three ways, as the tunnel runs them:
  plain     no recording: the request's head is read and the rest passes unread
  walk      --record's Exchange (records_only): the request is walked by its schema so
            that only its record data passes unread; nothing is written
  record    the same walk, the Exchange handing each frame to a recording (its trace
            and a Recorder writing the pcapng)
Prints microseconds per request (hot caches: in its last bench the running tunnel paid
about twice what recording adds here, its caches cold between 1 MB splices) and, with
--callgrind, instructions per request counted by valgrind (the same numbers run after
run, whatever else the machine does), each mode's start-up subtracted by a second run
with no requests.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kio.schema.errors import ErrorCode
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v9.response import (
    PartitionProduceResponse,
    ProduceResponse,
    TopicProduceResponse,
)
from kio.static.primitive import i32Timedelta

from kafkatunnel.capture.recorder import Listener, Recorder, Recording
from kafkatunnel.protocol import Direction, Exchange, FramePassed, rewrite_caps
from kafkatunnel.tunnel.relay import HEAD_READ, PIPE_SIZE, SPLICE_MIN
from tests.kio_messages import encode, request_frame, response_frame

MODES = ("plain", "walk", "record")
TOPIC = "bench-topic-abcdef"
NO_TIME = i32Timedelta.parse(datetime.timedelta(0))


def produce(correlation_id: int, size: int) -> bytes:
    data = PartitionProduceData(index=0, records=random.randbytes(size))  # type: ignore[arg-type]
    message = ProduceRequest(
        transactional_id=None,
        acks=1,  # type: ignore[arg-type]
        timeout=NO_TIME,
        topic_data=(TopicProduceData(name=TOPIC, partition_data=(data,)),),  # type: ignore[arg-type]
    )
    return request_frame(message, correlation_id, client_id="rdkafka")


def answer(correlation_id: int) -> bytes:
    partition = PartitionProduceResponse(
        index=0,  # type: ignore[arg-type]
        error_code=ErrorCode.none,
        base_offset=0,  # type: ignore[arg-type]
        log_append_time=None,
        log_start_offset=0,  # type: ignore[arg-type]
        record_errors=(),
        error_message=None,
    )
    topic = TopicProduceResponse(name=TOPIC, partition_responses=(partition,))  # type: ignore[arg-type]
    return response_frame(0, 9, encode(ProduceResponse(responses=(topic,), throttle_time=NO_TIME)),
                          correlation_id)  # fmt: skip


def relay(
    direction: Direction,
    data: bytes,
    read_size: int,
    on_frames: Callable[[Sequence[FramePassed]], None] | None,
) -> None:
    """Feed one frame as the relay's Pump does (splice when enough may pass unread), handing
    the frames that passed to on_frames."""
    pos = 0
    while pos < len(data):
        if direction.unread >= SPLICE_MIN:
            moved = min(direction.unread, PIPE_SIZE)
            frames = direction.skip(moved)
            pos += moved
        else:
            chunk = data[pos : pos + read_size]
            pos += len(chunk)
            frames = direction.feed(chunk).frames
        if frames and on_frames is not None:
            on_frames(frames)


def run(mode: str, requests: int, size: int) -> float:
    """Seconds per request over `requests` requests (and their answers) in this mode."""
    frames = [(produce(i, size), answer(i)) for i in range(8)]
    exchange = Exchange(lambda _: ("127.0.0.1", 9093), rewrite_caps(), records_only=mode != "plain")
    recording: Recording | None = None
    if mode == "record":
        recorder = Recorder(Path(tempfile.mkdtemp(prefix="kafkatunnel-bench-recording-")))
        listener = Listener(111, f"{TOPIC}:9092", "127.0.0.1:9093")
        recording = recorder.connection(listener, ("127.0.0.1", 50000), ("127.0.0.1", 9093))
        exchange.observe()
    # What start-up made is never collected: frozen out of the GC's sight, so that a full
    # collection (some 12 million instructions over the imports' objects) falling in one
    # run and not in the other does not count as the requests' cost.
    gc.collect()
    gc.freeze()

    on_requests = None if recording is None else recording.requests
    on_responses = None if recording is None else recording.responses

    async def relayed() -> float:
        """Inside an event loop, as in the tunnel: the recorder hands its blocks to its
        writer thread in batches (see recorder.HAND_OVER), not one by one."""
        start = time.perf_counter()
        for index in range(requests):
            request, response = frames[index % len(frames)]
            relay(exchange.requests, request, HEAD_READ, on_requests)
            relay(exchange.responses, response, 256 << 10, on_responses)
        return (time.perf_counter() - start) / max(requests, 1)

    seconds = asyncio.run(relayed())
    if recording is not None:
        recording.recorder.close()
        assert recording.trace.broken is None, recording.trace.broken
        assert recording.trace.frames == 2 * requests
    return seconds


def instructions(mode: str, requests: int, size: int) -> float:
    """Instructions per request, by valgrind's callgrind (start-up subtracted)."""
    return per_unit(lambda n: [__file__, "--child", mode, str(n), str(size)], requests)


def per_unit(argv: Callable[[int], list[str]], units: int) -> float:
    """Instructions per unit of work, by valgrind's callgrind: the Python program argv(n)
    does n units; a run with none is subtracted (start-up), hash seeds fixed."""
    counts = []
    for n in (0, units):
        with tempfile.NamedTemporaryFile(prefix="callgrind-") as out:
            done = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}",
                 sys.executable, "-P", *argv(n)],
                capture_output=True, text=True, check=True,
                # valgrind cannot follow libuv's io_uring (its batched epoll_ctl)
                env={**os.environ, "PYTHONHASHSEED": "0", "UV_USE_IO_URING": "0"},
            )  # fmt: skip
        line = next(x for x in done.stderr.splitlines() if "Collected" in x)
        counts.append(int(line.rsplit(":", 1)[1].replace(",", "")))
    return (counts[1] - counts[0]) / units


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--size", type=int, default=1 << 20, help="record bytes per request")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--callgrind", action="store_true", help="count instructions too")
    args = parser.parse_args()
    random.seed(0)
    timed = {mode: sorted(run(mode, args.requests, args.size) for _ in range(args.rounds))
             for mode in MODES}  # fmt: skip
    print(f"{args.requests} Produce requests of {args.size:,} record bytes, and their answers")
    print("| mode | us per request (median of rounds) | vs plain |")
    print("| --- | ---: | ---: |")
    plain = timed["plain"][len(timed["plain"]) // 2]
    for mode, seconds in timed.items():
        median = seconds[len(seconds) // 2]
        print(f"| {mode} | {median * 1e6:.1f} | {median / plain:.2f}x |")
    if args.callgrind:
        print("\n| mode | instructions per request | added by the step |")
        print("| --- | ---: | ---: |")
        previous = 0.0
        for mode in MODES:
            count = instructions(mode, args.requests, args.size)
            print(f"| {mode} | {count:,.0f} | {count - previous:+,.0f} |")
            previous = count


if __name__ == "__main__":
    main()
