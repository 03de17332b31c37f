"""What the relay's own code costs per small round trip, without a broker or other processes:
repeatable where the tunnel bench (bench_tunnel.py) is not.

    .venv/bin/python scripts/bench_relay.py [--trips 20000] [--rounds 5] [--in-flight 1]
        [--ways floor,passthrough,kafkatunnel] [--callgrind] [--against REV | --baseline DIR]

One event loop (uvloop) runs a client, the relay and an answering peer over socketpairs.
The client sends small Produce requests (100 record bytes, acks=1), --in-flight of them in
one write, and waits for their answers; the peer answers each request with a canned Produce
answer of the same correlation id. Ways:
  direct      the client's socket is the peer's: the harness alone, subtracted from the rest
  floor       a relay that only reads and writes (os.read, os.writev), as little as
              Python on uvloop can do: what any Python relay pays
  passthrough the tunnel's Pumps with a PassThrough (transparent mode): bytes unread
  kafkatunnel the tunnel's Pumps with its Exchange, as a plain connection runs
Prints microseconds per request added over direct (median of rounds, and the range of the
rounds), on the clock and of the process's CPU (steadier on a shared machine: time spent
waiting for a core is not counted), and, with --callgrind, instructions per request added
over direct, counted by valgrind (the same numbers run after run, whatever else the
machine does). --against REV
runs the same from the package of an earlier commit beside this one (exported with git
archive to a temporary directory; its passthrough and kafkatunnel ways), --baseline DIR
from an earlier source tree, e.g. a git worktree. Each round runs every way once, in a new
random order, each in a process of its own: a spell of noise falls on every way alike, and
the two trees are compared round by round as well.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import os
import random
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
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


async def _trips(way: str, trips: int, in_flight: int) -> tuple[float, float]:
    """Seconds per request, this way: on the clock, and of the process's CPU."""
    loop = asyncio.get_running_loop()
    frames = FRAMES * in_flight
    requests = [produce(i, 100) for i in range(frames)]
    answers = [answer(i) for i in range(frames)]
    if len({len(r) for r in requests}) != 1 or len({len(a) for a in answers}) != 1:
        raise SystemExit("the canned requests (or answers) differ in length")
    # what the client writes each trip, and how many bytes of answers it waits for
    bursts = [b"".join(requests[i : i + in_flight]) for i in range(0, frames, in_flight)]
    want = len(answers[0]) * in_flight
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
    unanswered = 0  # bytes of requests read, not answered yet (a request comes in parts)

    def serve() -> None:
        nonlocal served, unanswered
        unanswered += len(os.read(peer.fileno(), 262144))
        count, unanswered = divmod(unanswered, len(requests[0]))
        if count:
            first = served % frames
            os.write(peer.fileno(), b"".join(answers[first : first + count]))
            served += count

    loop.add_reader(peer.fileno(), serve)
    arrived: asyncio.Future[None] | None = None

    def readable() -> None:
        if arrived is not None and not arrived.done():
            arrived.set_result(None)

    loop.add_reader(client.fileno(), readable)
    gc.collect()
    gc.freeze()  # start-up's objects: out of every collection's way
    start, cpu = time.perf_counter(), time.process_time()
    for trip in range(trips):
        os.write(client.fileno(), bursts[trip % FRAMES])
        got = 0
        while got < want:
            arrived = loop.create_future()
            await arrived
            got += len(os.read(client.fileno(), 262144))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    for pump in keep:
        if isinstance(pump, Pump):
            pump.close()
    for sock in {id(s): s for s in (client, relay_client, peer, *keep)}.values():
        if isinstance(sock, socket.socket):
            loop.remove_reader(sock.fileno())
            sock.close()
    requests_made = max(trips * in_flight, 1)
    return elapsed / requests_made, cpu / requests_made


def run(way: str, trips: int, in_flight: int) -> tuple[float, float]:
    return uvloop.run(_trips(way, trips, in_flight))


def _child(way: str, trips: int, in_flight: int, root: str) -> list[str]:
    return [__file__, "--child", way, str(trips), str(in_flight), "--child-root", root]


def instructions(way: str, trips: int, in_flight: int, root: str) -> float:
    """Instructions per request, by valgrind's callgrind (start-up subtracted)."""
    return per_unit(lambda n: _child(way, n, in_flight, root), trips) / in_flight


def timed(way: str, trips: int, in_flight: int, root: str) -> tuple[float, float]:
    """Seconds per request, on the clock and of CPU, in a process of its own (the tree's
    package imported)."""
    done = subprocess.run(
        [sys.executable, "-P", *_child(way, trips, in_flight, root)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    wall, cpu = done.stdout.split()
    return float(wall), float(cpu)


def export(revision: str, into: str) -> str:
    """The package as it was at `revision` (git archive), under `into`: its short name."""
    repo = str(Path(__file__).resolve().parent.parent)
    short = subprocess.run(
        ["git", "-C", repo, "rev-parse", "--short", f"{revision}^{{commit}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    archive = subprocess.run(
        ["git", "-C", repo, "archive", "--format=tar", short, "kafkatunnel"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return short


def _table(samples: dict[str, list[float]], title: str, pairs: list[tuple[str, str]]) -> None:
    """Each way's median and the range of its rounds, added over direct (direct's of the
    same round); then each way against the earlier tree's, round by round."""
    added = {name: [(s - d) * 1e6 for s, d in zip(seconds, samples["direct"], strict=True)]
             for name, seconds in samples.items()}  # fmt: skip
    direct = statistics.median(samples["direct"])
    print(f"\n| way | {title} | added over direct | added, rounds |")
    print("| --- | ---: | ---: | ---: |")
    for name, seconds in samples.items():
        median = statistics.median(seconds)
        low, high = min(added[name]), max(added[name])
        print(f"| {name} | {median * 1e6:.2f} | {(median - direct) * 1e6:+.2f} | "
              f"{low:+.2f} to {high:+.2f} |")  # fmt: skip
    if pairs:
        print("\n| added over direct, vs the earlier tree | median of rounds | rounds |")
        print("| --- | ---: | ---: |")
    for earlier, way in pairs:
        ratios = [a / b for a, b in zip(added[way], added[earlier], strict=True) if b > 0]
        if ratios:
            print(f"| {way} / {earlier} | {statistics.median(ratios):.3f} | "
                  f"{min(ratios):.3f} to {max(ratios):.3f} |")  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(*run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trips", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--in-flight", type=int, default=1, help="requests in one write")
    parser.add_argument("--ways", default=",".join(WAYS[1:]), help="besides direct")
    parser.add_argument("--callgrind", action="store_true", help="count instructions too")
    earlier = parser.add_mutually_exclusive_group()
    earlier.add_argument("--against", metavar="REV", help="an earlier commit, side by side")
    earlier.add_argument("--baseline", help="an earlier source tree, e.g. a git worktree")
    args = parser.parse_args()
    ways = ["direct", *(w for w in WAYS[1:] if w in args.ways.split(","))]
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as scratch:
        here = str(Path(__file__).resolve().parent.parent)
        runs = [(way, way, here) for way in ways]
        if args.against:
            label = export(args.against, scratch)
            runs += [(f"{way} ({label})", way, scratch) for way in ways if way in WAYS[2:]]
        elif args.baseline:
            runs += [(f"{way} (baseline)", way, args.baseline) for way in ways if way in WAYS[2:]]
        measure(runs, args)


def measure(runs: list[tuple[str, str, str]], args: argparse.Namespace) -> None:
    trips, in_flight = args.trips, args.in_flight
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in runs}
    order = random.Random(0)
    for _ in range(args.rounds):  # interleaved: a spell of noise falls on every way
        for name, way, root in order.sample(runs, len(runs)):
            samples[name].append(timed(way, trips, in_flight, root))
    unit = "round trip" if in_flight == 1 else f"request ({in_flight} in flight)"
    print(f"{trips} trips of {in_flight} small Produce request(s), {args.rounds} rounds")
    pairs = [(name, name.split(" (")[0]) for name in samples if " (" in name]
    for clock, title in ((0, "on the clock"), (1, "of CPU (the one process's)")):
        _table({name: [s[clock] for s in seconds] for name, seconds in samples.items()},
               f"us per {unit}, {title}", pairs)  # fmt: skip
    if args.callgrind:
        counts = {name: instructions(way, trips // 10, in_flight, root)
                  for name, way, root in runs}  # fmt: skip
        print(f"\n| way | instructions per {unit} | added over direct |")
        print("| --- | ---: | ---: |")
        for name, count in counts.items():
            print(f"| {name} | {count:,.0f} | {count - counts['direct']:+,.0f} |")
        for earlier, way in pairs:
            mine, theirs = (counts[n] - counts["direct"] for n in (way, earlier))
            print(f"\n{way}: {mine / theirs:.3f}x the instructions of {earlier} "
                  f"({mine - theirs:+,.0f} per {unit})")  # fmt: skip


if __name__ == "__main__":
    main()
