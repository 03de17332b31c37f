"""Queries per second answered by the DNS shim.

    .venv/bin/python scripts/bench_dns.py [--seconds 5] [--window 64]

The shim runs in its own process (as in `kafkatunnel up --dns`); one client process keeps
`--window` UDP queries in flight for broker names (A), their AAAA, and names outside the
zone (REFUSED), and counts the answers.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dnslib import DNSRecord

from kafkatunnel.dns import DnsServer, Zone
from kafkatunnel.hostnames import ClusterZones


def serve(port: int, ready: multiprocessing.synchronize.Event) -> None:
    async def main() -> None:
        zone = Zone()
        for i in range(6):
            zone.add(
                ClusterZones.of(
                    [name := f"kafka-{i}.kafka-headless.prod.svc.cluster.local"]
                ).names_of(name),
                f"127.0.0.{2 + i}",
            )
        server = DnsServer(zone, "127.0.0.1", port)
        await server.start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def measure(port: int, seconds: float, window: int) -> tuple[int, int]:
    queries = [
        DNSRecord.question(name, qtype).pack()
        for name, qtype in [
            ("kafka-0.kafka-headless.prod.svc.cluster.local", "A"),
            ("kafka-3.kafka-headless", "A"),
            ("kafka-1.kafka-headless.prod.svc.cluster.local", "AAAA"),
            ("example.com", "A"),
        ]
    ]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(0.5)
    sent = answered = 0
    for _ in range(window):
        sock.send(queries[sent % len(queries)])
        sent += 1
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            sock.recv(4096)
            answered += 1
        except TimeoutError:
            for _ in range(window):  # lost in the kernel: refill the window
                sock.send(queries[sent % len(queries)])
                sent += 1
            continue
        sock.send(queries[sent % len(queries)])
        sent += 1
    return sent, answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=serve, args=(port, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(10):
            raise RuntimeError("the DNS shim did not start")
        for round_ in range(args.rounds):
            sent, answered = measure(port, args.seconds, args.window)
            rate = answered / args.seconds
            print(f"round {round_ + 1}: {rate:,.0f} answers/s ({answered:,} of {sent:,} sent)")
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
