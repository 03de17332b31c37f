"""What the relay's own code costs per small round trip, without a broker or other processes:
repeatable where the tunnel bench (bench_tunnel.py) is not.

    .venv/bin/python scripts/bench_relay.py [--trips 20000] [--callgrind] [--baseline DIR]

One event loop (uvloop) runs a client, the relay and an answering peer over socketpairs.
The client sends a small Produce (100 record bytes, acks=1) and waits for its answer; the
peer answers each request with a canned Produce answer of the same correlation id. Ways:
  direct      the client's socket is the peer's: the harness alone, subtracted from the rest
  floor       a relay that only reads and writes (os.read, os.writev), as little as
              Python on uvloop can do: what any Python relay pays
  passthrough the tunnel's Pumps with a PassThrough (transparent mode): bytes unread
  kafkatunnel the tunnel's Pumps with its Exchange, as a plain connection runs
Prints microseconds per round trip added over direct (median of rounds) and, with
--callgrind, instructions per round trip added over direct, counted by valgrind (the same
numbers run after run, whatever else the machine does). --baseline DIR runs the same from
an earlier source tree beside this one (its passthrough and kafkatunnel ways).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--child-root" in sys.argv:  # run from another tree (--baseline): its package, first
    sys.path.insert(0, sys.argv[sys.argv.index("--child-root") + 1])
    import kafkatunnel  # noqa: F401  (before bench_recording puts this tree first)

import uvloop
from bench_recording import answer, per_unit, produce

from kafkatunnel.protocol import Exchange, PassThrough, rewrite_caps
from kafkatunnel.tunnel.relay import Pump
from kafkatunnel.tunnel.streams import PlainStream

WAYS = ("direct", "floor", "passthrough", "kafkatunnel")
FRAMES = 8  # distinct correlation ids, reused in turn (one request in flight at a time)


def _pair() -> tuple[socket.socket, socket.socket]:
    one, other = socket.socketpair()
    for sock in (one, other):
        sock.setblocking(False)
    return one, other


def _floor(loop: asyncio.AbstractEventLoop, a: socket.socket, b: socket.socket) -> None:
    """Read, write: nothing else (the peer and the client never fill a socket's buffer)."""
    for source, sink in ((a.fileno(), b.fileno()), (b.fileno(), a.fileno())):

        def ready(source: int = source, sink: int = sink) -> None:
            os.writev(sink, [os.read(source, 262144)])

        loop.add_reader(source, ready)


def _pumps(way: str, a: socket.socket, b: socket.socket) -> list[Pump]:
    exchange = PassThrough() if way == "passthrough" else Exchange(
        lambda _: ("127.0.0.1", 9093), rewrite_caps()
    )  # fmt: skip
    client, upstream = PlainStream(a.fileno(), a.fileno()), PlainStream(b.fileno(), b.fileno())

    def failed(cause: object) -> None:
        raise SystemExit(f"the relay failed: {cause}")

    pumps = [
        Pump(client, upstream, exchange.requests, zero_copy=True, on_bytes=lambda _: None,
             on_source_end=failed, on_sink_error=failed),
        Pump(upstream, client, exchange.responses, zero_copy=True, on_bytes=lambda _: None,
             on_source_end=failed, on_sink_error=failed),
    ]  # fmt: skip
    for pump in pumps:
        pump.start()
    return pumps


async def _trips(way: str, trips: int) -> float:
    """Seconds per round trip, this way."""
    loop = asyncio.get_running_loop()
    requests = [produce(i, 100) for i in range(FRAMES)]
    answers = [answer(i) for i in range(FRAMES)]
    client, relay_client = _pair()
    if way == "direct":
        peer, keep = relay_client, []
    else:
        relay_upstream, peer = _pair()
        keep = [relay_client, relay_upstream]
        if way == "floor":
            _floor(loop, relay_client, relay_upstream)
        else:
            keep += _pumps(way, relay_client, relay_upstream)  # type: ignore[arg-type]
    served = 0

    def serve() -> None:
        nonlocal served
        os.read(peer.fileno(), 262144)  # one small request, whole (the client waits)
        os.write(peer.fileno(), answers[served % FRAMES])
        served += 1

    loop.add_reader(peer.fileno(), serve)
    arrived: asyncio.Future[None] | None = None

    def readable() -> None:
        if arrived is not None and not arrived.done():
            arrived.set_result(None)

    loop.add_reader(client.fileno(), readable)
    gc.collect()
    gc.freeze()  # start-up's objects: out of every collection's way
    start = time.perf_counter()
    for trip in range(trips):
        want = len(answers[trip % FRAMES])
        os.write(client.fileno(), requests[trip % FRAMES])
        got = 0
        while got < want:
            arrived = loop.create_future()
            await arrived
            got += len(os.read(client.fileno(), 262144))
    elapsed = time.perf_counter() - start
    for pump in keep:
        if isinstance(pump, Pump):
            pump.close()
    for sock in {id(s): s for s in (client, relay_client, peer, *keep)}.values():
        if isinstance(sock, socket.socket):
            loop.remove_reader(sock.fileno())
            sock.close()
    return elapsed / max(trips, 1)


def run(way: str, trips: int) -> float:
    return uvloop.run(_trips(way, trips))


def instructions(way: str, trips: int, root: str) -> float:
    """Instructions per round trip, by valgrind's callgrind (start-up subtracted)."""
    return per_unit(lambda n: [__file__, "--child", way, str(n), "--child-root", root], trips)


def timed(way: str, trips: int, root: str) -> float:
    """Seconds per round trip, in a process of its own (the tree's package imported)."""
    done = subprocess.run(
        [sys.executable, "-P", __file__, "--child", way, str(trips), "--child-root", root],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(done.stdout)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(run(sys.argv[2], int(sys.argv[3])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trips", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--callgrind", action="store_true", help="count instructions too")
    parser.add_argument("--baseline", help="an earlier source tree, e.g. a git worktree")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    runs = [(way, way, here) for way in WAYS]
    if args.baseline:
        runs += [(f"{way} (baseline)", way, args.baseline) for way in WAYS[2:]]
    samples: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for _ in range(args.rounds):  # interleaved: a spell of noise falls on every way
        for name, way, root in runs:
            samples[name].append(timed(way, args.trips, root))
    direct = statistics.median(samples["direct"])
    print(f"{args.trips} small Produce round trips, {args.rounds} rounds")
    print("| way | us per round trip | added over direct |")
    print("| --- | ---: | ---: |")
    for name, seconds in samples.items():
        median = statistics.median(seconds)
        print(f"| {name} | {median * 1e6:.1f} | {(median - direct) * 1e6:+.1f} |")
    if args.callgrind:
        counts = {name: instructions(way, args.trips // 10, root) for name, way, root in runs}
        print("\n| way | instructions per round trip | added over direct |")
        print("| --- | ---: | ---: |")
        for name, count in counts.items():
            print(f"| {name} | {count:,.0f} | {count - counts['direct']:+,.0f} |")


if __name__ == "__main__":
    main()
