"""What asking whose a client connection is costs, per connection, side by side.

    .venv/bin/python scripts/bench_peer_user.py [--rounds 2000] [--sockets 0,1000,10000]

A tunnel that logs in for its clients asks the kernel, for each connection it accepts,
which user made the client's socket (kafkatunnel/tunnel/login_users.py). Two ways:
netlink sock_diag looks that one socket up by its addresses (what the tunnel does);
reading /proc/net/tcp (and tcp6) scans a row per TCP socket of the machine's for it. Both
run here on the same accepted connection, with `--sockets` TCP sockets added beside it
(loopback connections' two ends; a busy developer machine holds a few thousand), and
beside them what a loopback connection itself costs (connect and accept), for scale.
Medians, microseconds.
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafkatunnel.tunnel.peer_user import Ends, Owner, PeerUsers


def proc_net_tcp_uid(ends: Ends) -> int | None:
    """The alternative: the uid column of the client's row in /proc/net/tcp{,6}."""
    port = f"{ends.peer[1]:04X}"
    local_port = f"{ends.local[1]:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                if fields[1].endswith(":" + port) and fields[2].endswith(":" + local_port):
                    return int(fields[7])
    return None


def median_us(rounds: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        run()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000


def connect_accept(server: socket.socket) -> Callable[[], None]:
    address = server.getsockname()

    def run() -> None:
        client = socket.create_connection(address)
        accepted, _ = server.accept()
        accepted.close()
        client.close()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--sockets", default="0,1000,10000")
    args = parser.parse_args()
    counts = [int(n) for n in args.sockets.split(",")]
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(counts) + 1000), hard))
    peers = PeerUsers()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4096)
    held: list[socket.socket] = []
    print("| TCP sockets added | sock_diag µs | /proc/net/tcp µs | ratio | "
          "connect+accept µs |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|")
    for count in counts:
        while len(held) < count:  # each connection is two sockets, both rows of the table
            held.append(socket.create_connection(server.getsockname()))
            held.append(server.accept()[0])
        with socket.create_connection(server.getsockname()) as client:
            accepted, peer = server.accept()
            with accepted:
                ends = Ends.of(peer, accepted.getsockname())
                assert isinstance(peers.user_of(ends), Owner)
                assert proc_net_tcp_uid(ends) is not None
                diag = median_us(args.rounds, partial(peers.user_of, ends))
                rounds = max(20, args.rounds // (1 + count // 100))
                scan = median_us(rounds, partial(proc_net_tcp_uid, ends))
        del client
        setup = median_us(min(args.rounds, 500), connect_accept(server))
        print(f"| {count} | {diag:.1f} | {scan:.1f} | {scan / diag:.0f} | {setup:.1f} |",
              flush=True)  # fmt: skip
    for sock in held:
        sock.close()
    server.close()
    peers.close()


if __name__ == "__main__":
    main()
