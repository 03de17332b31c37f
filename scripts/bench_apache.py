"""Throughput and latency through kafkatunnel to Apache Kafka, side by side.

    .venv/bin/python scripts/bench_apache.py [--rounds 5] [--messages 150000]

The reference cluster (tests/worlds/apache.py: Apache Kafka, three KRaft
nodes in a network of their own, advertising Kubernetes names), measured on four paths:
  direct           the client inside the cluster's network (as a pod would be)
  kafkatunnel      `kafkatunnel up --via exec`, each forward `ip netns exec ... socat`
                   (the stand-in for a kubectl port-forward), on the host
  socat            a socat relay per broker on a laptop (a network namespace) whose hosts
                   file sends each broker's name to its relay, each relay carrying its
                   connections into the cluster the same way: the hosts-entry workaround,
                   one forward per broker
  kafkatunnel-tls  the tunnel with --tls to the brokers' TLS listener (cluster CA)
  direct-tls       the client inside the cluster's network speaking TLS itself
Each path's client runs where that path's clients would, as a child process (this script
with --measure); the order of paths is shuffled each round, with a direct measurement
before and after each (as bench_tunnel.py does). Produce N x 1 KiB (acks=1), consume them
from the start, Metadata round trips for latency; relay CPU per MB is the tunnel's (or the
relays') processes and their children, the forwards' socats included.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_tunnel import TRIPS, _tree, consume, cpu_times, cpu_used, latency, produce

from kafkatunnel.demo import free_port_run
from kafkatunnel.demo.apache import broker_address, broker_host
from kafkatunnel.demo.netns import NetworkNamespace
from kafkatunnel.demo.processes import ManagedProcess
from tests.worlds.apache import LISTENERS, ApacheKafka

VALUE = 1024
HERE = Path(__file__).resolve()


@dataclass
class Path_:
    name: str
    bootstrap: str
    where: list[str]  # the argv prefix that runs the client where this path's clients are
    client: dict[str, str] = field(default_factory=dict)
    relays: list[ManagedProcess] = field(default_factory=list)
    produce: list[float] = field(default_factory=list)
    consume: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    relay_cpu: list[float] = field(default_factory=list)
    produce_ratio: list[float] = field(default_factory=list)
    consume_ratio: list[float] = field(default_factory=list)
    p99_added: list[float] = field(default_factory=list)
    trips: list[dict[str, list[float]]] = field(default_factory=list)  # kind -> [p50, p99]
    trips_added: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


def measure_here(bootstrap: str, messages: int, requests: int, client: dict[str, str]) -> None:
    """The child: one measurement where it runs, as JSON on stdout."""
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    produced = produce(bootstrap, topic, messages, client=client)
    consumed = consume(bootstrap, topic, messages, client=client)
    nan = (float("nan"), float("nan"))
    trips = latency(bootstrap, requests, topic) if not client else {kind: nan for kind in TRIPS}
    p50, p99 = trips["metadata"]
    print(json.dumps({"produce": produced, "consume": consumed, "p50": p50, "p99": p99,
                      "trips": trips}))  # fmt: skip


def measure(path: Path_, args: argparse.Namespace) -> dict[str, Any]:
    pids = [p.pid for p in path.relays]
    before = cpu_times([pid for root in pids for pid in _tree(root)])
    argv = [*path.where, sys.executable, str(HERE), "--measure", path.bootstrap,
            "--messages", str(args.messages), "--requests", str(args.requests),
            "--client", json.dumps(path.client)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"{path.name}: {result.stderr[-3000:]}")
    sample: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    used = cpu_used(before, cpu_times([pid for root in pids for pid in _tree(root)]))
    path.relay_cpu.append(used * 1000 / (args.messages * VALUE / 1e6))
    for key in ("produce", "consume", "p50", "p99"):
        getattr(path, key).append(sample[key])
    path.trips.append(sample["trips"])
    print(f"{path.name:16} produce {sample['produce']:7.1f} MB/s  consume "
          f"{sample['consume']:7.1f} MB/s  p50 {sample['p50']:.3f} ms  p99 {sample['p99']:.3f} ms"
          f"  relay CPU {path.relay_cpu[-1]:.2f} ms/MB", flush=True)  # fmt: skip
    return sample


def start_paths(
    kafka: ApacheKafka, laptop: NetworkNamespace, baseline: str | None = None
) -> list[Path_]:
    assert kafka.namespace is not None and kafka.credentials is not None
    inside = kafka.namespace.exec_prefix()
    tls_client = {"security.protocol": "SSL", "ssl.ca.location": str(kafka.credentials.cluster_ca)}
    paths = [
        Path_("direct", kafka.bootstrap(), inside),
        Path_("direct-tls", kafka.bootstrap("tls"), inside, client=tls_client),
    ]
    tunnels = [
        ("kafkatunnel", "plain", []),
        ("kafkatunnel-tls", "tls", ["--tls", "--tls-ca", str(kafka.credentials.cluster_ca)]),
    ]
    if baseline:
        tunnels += [(f"{name}-baseline", listener, flags) for name, listener, flags in tunnels]
    for name, listener, flags in tunnels:
        # -P: not the working directory first on sys.path, so PYTHONPATH picks the tree
        tree = {"PYTHONPATH": baseline} if baseline and name.endswith("-baseline") else {}
        up = ManagedProcess(
            [sys.executable, "-P", "-m", "kafkatunnel", "up", "--no-table", "--bootstrap",
             kafka.bootstrap(listener), "--exec", kafka.exec_template(),
             "--listen", f"127.0.0.1:{free_port_run(8)}", *flags],
            name=name,
            env={"KAFKATUNNEL_STATE_DIR": tempfile.mkdtemp(prefix="kt-bench-"), **tree},
        )  # fmt: skip
        bootstrap = up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=60).group(1)
        paths.append(Path_(name, bootstrap, [], relays=[up]))
    socat = Path_("socat", kafka.bootstrap(), laptop.exec_prefix())
    into = " ".join(inside)
    port = LISTENERS["plain"]
    for node in range(kafka.nodes):
        relay = ManagedProcess(
            [*laptop.exec_prefix(), "socat",
             f"TCP-LISTEN:{port},bind=127.0.0.{21 + node},fork,reuseaddr,nodelay",
             f"EXEC:{into} socat STDIO TCP\\:{broker_address(node)}\\:{port}\\,nodelay"],
            name=f"socat-{node}",
        )  # fmt: skip
        relay.wait_accepting(port, timeout=10, connect=functools.partial(_at, laptop, node))
        socat.relays.append(relay)
    paths.append(socat)
    return paths


def _at(laptop: NetworkNamespace, node: int, _host: str, port: int) -> socket.socket:
    return laptop.connect(f"127.0.0.{21 + node}", port)


def report(paths: list[Path_], args: argparse.Namespace) -> None:
    med = statistics.median
    print(f"\n{args.rounds} rounds, {args.messages:,} x {VALUE} B, acks=1; medians over rounds\n")
    print("| path | produce MB/s | vs direct | consume MB/s | vs direct | p50 ms | p99 ms "
          "| p99 added | relay CPU ms/MB |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for path in paths:
        first = path.name == "direct"
        cells = [path.name, f"{med(path.produce):.0f}",
                 "100%" if first else f"{med(path.produce_ratio):.0%}",
                 f"{med(path.consume):.0f}",
                 "100%" if first else f"{med(path.consume_ratio):.0%}",
                 f"{med(path.p50):.3f}", f"{med(path.p99):.3f}",
                 "+0.000" if first else f"{med(path.p99_added):+.3f}",
                 f"{med(path.relay_cpu):.2f}"]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    print("\n| round trip: added over direct, p50 / p99 ms | " + " | ".join(TRIPS) + " |")
    print("| --- |" + " ---: |" * len(TRIPS))
    for path in paths:
        if path.trips_added:
            added = [path.trips_added[kind] for kind in TRIPS]
            cells = [f"{med(a[0] for a in rows):+.3f} / {med(a[1] for a in rows):+.3f}"
                     for rows in added]  # fmt: skip
            print(f"| {path.name} | " + " | ".join(cells) + " |")
    baselines = {p.name: p for p in paths if p.name.endswith("-baseline")}
    if baselines:
        print("\n| this tree vs --baseline | produce | consume | produce p50 added ms "
              "| relay CPU per MB |")  # fmt: skip
        print("| --- | ---: | ---: | ---: | ---: |")
        for path in paths:
            before = baselines.get(f"{path.name}-baseline")
            if before is None:
                continue
            cells = [f"{med(path.produce) / med(before.produce):.0%}",
                     f"{med(path.consume) / med(before.consume):.0%}",
                     f"{med(a[0] for a in path.trips_added['produce']):+.3f} vs "
                     f"{med(a[0] for a in before.trips_added['produce']):+.3f}",
                     f"{med(path.relay_cpu) / med(before.relay_cpu):.2f}x"]  # fmt: skip
            print(f"| {path.name} | " + " | ".join(cells) + " |")


def _added(mine: dict[str, list[float]], around: list[dict[str, list[float]]], path: Path_) -> None:
    """Each round trip kind's p50 and p99 added over the direct runs either side."""
    for kind in TRIPS:
        p50 = mine[kind][0] - sum(a[kind][0] for a in around) / 2
        p99 = mine[kind][1] - sum(a[kind][1] for a in around) / 2
        path.trips_added.setdefault(kind, []).append((p50, p99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=150_000)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--measure", metavar="BOOTSTRAP", help=argparse.SUPPRESS)
    parser.add_argument("--client", default="{}", help=argparse.SUPPRESS)
    parser.add_argument(
        "--baseline",
        help="also run the tunnel paths from this source tree (a git worktree of an earlier "
        "commit), as kafkatunnel-baseline and kafkatunnel-tls-baseline",
    )
    args = parser.parse_args()
    if args.measure:
        measure_here(args.measure, args.messages, args.requests, json.loads(args.client))
        return
    with ApacheKafka() as kafka:
        hosts = {broker_host(n): f"127.0.0.{21 + n}" for n in range(kafka.nodes)}
        with NetworkNamespace(hosts=hosts) as laptop:
            paths = start_paths(kafka, laptop, args.baseline)
            try:
                direct, others = paths[0], paths[1:]
                for round_ in range(args.rounds):
                    print(f"round {round_ + 1}", flush=True)
                    random.shuffle(others)
                    before = measure(direct, args)
                    for path in others:
                        mine = measure(path, args)
                        after = measure(direct, args)
                        for key, ratio in (("produce", path.produce_ratio),
                                           ("consume", path.consume_ratio)):  # fmt: skip
                            ratio.append(2 * mine[key] / (before[key] + after[key]))
                        path.p99_added.append(mine["p99"] - (before["p99"] + after["p99"]) / 2)
                        if not path.client:  # the probe speaks plaintext
                            _added(mine["trips"], [before["trips"], after["trips"]], path)
                        before = after
            finally:
                for path in paths:
                    for process in path.relays:
                        process.stop()
    report(paths, args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(HERE.parent.parent))
    main()
