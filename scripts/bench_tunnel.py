"""Throughput and latency through kafkatunnel, side by side with the alternatives.

    .venv/bin/python scripts/bench_tunnel.py [--rounds 5] [--messages 300000]
    .venv/bin/python scripts/bench_tunnel.py --idle 1000 --tunnels uvloop,uvloop-tls
    .venv/bin/python scripts/bench_tunnel.py --refreshes 2000 --baseline /tmp/base

Paths to a tansu broker on this machine's loopback, each its own broker process:
  direct       the client talks to the broker
  socat        a plain TCP relay (the broker advertises the relay's address)
  python-floor with --floor: a Python relay on uvloop that only reads and writes
               (scripts/floor_relay.py; the broker advertises its address)
  tansu-proxy  `tansu proxy`, a Rust Kafka proxy (same binary as the broker)
  kafkatunnel  `kafkatunnel up --via direct`, a separate process, the broker advertising
               a Kubernetes name that only the tunnel's rewriting makes usable; variants
               on asyncio's own loop, without zero-copy (--no-zero-copy), recording
               (--record DIR), recording with payloads (--record-payloads) and TLS to
               the broker (--tls: socat's OpenSSL listener in front of the broker, as
               a TLS broker would terminate it itself) on request
  direct-tls   with --tls-paths: the client speaks TLS itself (security.protocol=SSL,
               hostname verified) to the same kind of OpenSSL listener in front of a broker
               that advertises the listener's address
  socat-tls    with --tls-paths: a TLS-originating relay, plaintext in and TLS out,
               verifying the listener's certificate (socat OPENSSL, 1.7.4), the broker
               advertising the relay's address
Each round measures the other paths in random order with a direct measurement before and
after each one (direct, A, direct, B, direct, ...): a path is compared with the mean of the
two direct measurements around it, so a spell of noise on this shared machine falls on
both sides of a comparison. Every measurement starts on a fresh broker (an in-memory
broker that kept each round's data grew slower from round to round). Produce: N x 1 KiB,
acks=1; consume: the same N from the start; latency: Metadata round trips on one
connection (each rewritten by the proxies that rewrite). "vs direct" and "added" are
medians over rounds of those comparisons; relay CPU is the relay processes' CPU time per
MB produced (every thread's, in the scheduler's nanoseconds). Recording variants are also
compared with the plain tunnel of the same round (their ratios to direct, divided), the
figure the recording's cost is judged by; so are TLS variants (their ratio includes socat's
TLS termination beside the broker, which a TLS broker pays itself).
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import socket
import ssl
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import confluent_kafka
from kafka.record.default_records import DefaultRecordBatchBuilder  # type: ignore[import-untyped]
from kio.index import load_request_schema
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9 import request as produce_v9
from kio.schema.produce.v11 import request as produce_v11

from kafkatunnel.demo import free_port
from kafkatunnel.demo.harness import TANSU_HOST, start_tansu, tansu_binary
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.probe import ProbeConnection, encode_request

VALUE = 1024


@dataclass
class Path_:
    name: str
    bootstrap: str = ""
    processes: list[ManagedProcess] = field(default_factory=list)  # the broker first
    broker_port: int = 0
    advertised: str = ""
    restart: Callable[[], ManagedProcess] | None = None  # a relay that outlives no broker
    scratch: Path | None = None  # emptied before each measurement (recordings)
    cluster_side: list[ManagedProcess] = field(default_factory=list)  # not the relay's CPU
    produce: list[float] = field(default_factory=list)
    consume: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    relay_cpu: list[float] = field(default_factory=list)  # relay CPU ms per MB produced
    client: dict[str, str] = field(default_factory=dict)  # client settings (TLS)
    probe_tls: ssl.SSLContext | None = None  # the latency probe speaks TLS
    # against the mean of the direct measurements just before and just after this path's
    produce_ratio: list[float] = field(default_factory=list)
    consume_ratio: list[float] = field(default_factory=list)
    p50_added: list[float] = field(default_factory=list)
    p99_added: list[float] = field(default_factory=list)
    trips_added: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # p50, p99

    def compare(self, mine: Sample, before: Sample, after: Sample) -> None:
        self.produce_ratio.append(2 * mine.produce / (before.produce + after.produce))
        self.consume_ratio.append(2 * mine.consume / (before.consume + after.consume))
        self.p50_added.append(mine.p50 - (before.p50 + after.p50) / 2)
        self.p99_added.append(mine.p99 - (before.p99 + after.p99) / 2)
        for kind, (p50, p99) in mine.trips.items():
            around = [before.trips[kind], after.trips[kind]]
            added = (p50 - sum(a[0] for a in around) / 2, p99 - sum(a[1] for a in around) / 2)
            self.trips_added.setdefault(kind, []).append(added)

    def fresh_broker(self) -> None:
        if self.scratch is not None:  # the open file is unlinked; its space comes back later
            for old in self.scratch.iterdir():
                old.unlink()
        self.processes[0].stop()
        self.processes[0] = broker(self.broker_port, self.advertised)
        if self.restart is not None:  # tansu proxy keeps its connections to the old broker
            self.processes[1].stop()
            self.processes[1] = self.restart()

    def relay_pids(self) -> list[int]:
        """The relay's processes and their children (socat forks one per connection)."""
        return [pid for process in self.processes[1:] for pid in _tree(process.pid)]


def _tree(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def cpu_times(pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of every thread of these processes, and of their reaped
    children: a thread's time on a CPU in nanoseconds from the scheduler
    (/proc/PID/task/TID/schedstat).

    Not utime + stime: those are ticks sampled 100 times a second, and a round's relay
    uses only some 0.1-0.3 s of CPU, so a sampled figure moved by a quarter from one
    measurement to the next for the same code."""
    times: dict[str, float] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            times[f"{pid} reaped"] = sum(int(f) for f in fields[13:15]) / ticks
            for task in os.listdir(f"/proc/{pid}/task"):
                ran = Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0]
                times[f"{pid}/{task}"] = int(ran) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile: its parent's reaped children count it
    return times


def cpu_used(before: dict[str, float], after: dict[str, float]) -> float:
    """CPU seconds used between two cpu_times() (a thread gone by then is not counted)."""
    return sum(max(0.0, spent - before.get(key, 0.0)) for key, spent in after.items())


def broker(listen: int, advertised: str) -> ManagedProcess:
    return start_tansu(listen, advertised, silent=True)


def _path(name: str, bootstrap: str, port: int, advertised: str) -> Path_:
    return Path_(name, bootstrap, [broker(port, advertised)], port, advertised)


def start_paths(
    tunnels: list[str], baseline: str | None = None, *, floor: bool = False
) -> list[Path_]:
    paths = []
    p = free_port()
    paths.append(_path("direct", f"127.0.0.1:{p}", p, f"127.0.0.1:{p}"))

    p, q = free_port(), free_port()
    relay = _path("socat", f"127.0.0.1:{q}", p, f"127.0.0.1:{q}")
    socat = ManagedProcess(
        [
            "socat",
            f"TCP-LISTEN:{q},bind=127.0.0.1,fork,reuseaddr,nodelay",
            f"TCP:127.0.0.1:{p},nodelay",
        ],
        name="socat",
    )
    socat.wait_accepting(q, timeout=30)
    relay.processes.append(socat)
    paths.append(relay)

    if floor:
        p, q = free_port(), free_port()
        least = _path("python-floor", f"127.0.0.1:{q}", p, f"127.0.0.1:{q}")
        relay_program = Path(__file__).resolve().parent / "floor_relay.py"
        floor_relay = ManagedProcess([sys.executable, str(relay_program), str(q), str(p)],
                                     name="python-floor")  # fmt: skip
        floor_relay.wait_accepting(q, timeout=30)
        least.processes.append(floor_relay)
        paths.append(least)

    p, q = free_port(), free_port()
    proxied = _path("tansu-proxy", f"127.0.0.1:{q}", p, f"127.0.0.1:{p}")

    def tansu_proxy(listen: int = q, origin: int = p) -> ManagedProcess:
        proxy = ManagedProcess(
            [
                tansu_binary(), "proxy", "--listener-url", f"tcp://127.0.0.1:{listen}",
                "--advertised-listener-url", f"tcp://127.0.0.1:{listen}",
                "--origin-url", f"tcp://127.0.0.1:{origin}",
            ],
            name="tansu-proxy",
        )  # fmt: skip
        proxy.wait_accepting(listen, timeout=30)
        return proxy

    proxied.processes.append(tansu_proxy())
    proxied.restart = tansu_proxy
    paths.append(proxied)

    for variant in tunnels:
        loop, _, kind = variant.partition("-")  # "", copy, record, record-payloads, baseline
        from_baseline = kind.endswith("baseline")  # run from the --baseline tree
        kind = kind.removesuffix("baseline").removesuffix("-")
        flags = ["--loop", loop] + (["--no-zero-copy"] if kind == "copy" else [])
        scratch = None
        cluster_side: list[ManagedProcess] = []
        if kind.startswith("record"):
            scratch = Path(tempfile.mkdtemp(prefix="kafkatunnel-bench-record-"))
            flags += ["--record", str(scratch)]
            flags += ["--record-payloads"] if kind == "record-payloads" else []
        # -P: not the working directory first on sys.path, so PYTHONPATH picks the tree
        code = {"PYTHONPATH": baseline} if from_baseline and baseline else {}
        name = f"kafkatunnel-{variant}" if variant != "uvloop" else "kafkatunnel"
        p, q = free_port(), free_port()
        reach = p  # the port the tunnel dials: the broker's, or its TLS listener's
        if kind == "tls":
            reach, terminator, ca_pem = _tls_listener(p)
            cluster_side.append(terminator)
            flags += ["--tls", "--tls-ca", str(ca_pem)]
        tunneled = _path(name, f"127.0.0.1:{q}", p, f"{TANSU_HOST}:{p}")
        tunneled.cluster_side = cluster_side
        up = ManagedProcess(
            [
                sys.executable, "-P", "-m", "kafkatunnel", "up", "--bootstrap", f"{TANSU_HOST}:{p}",
                "--via", "direct", "--map", f"{TANSU_HOST}:{p}=127.0.0.1:{reach}",
                "--listen", f"127.0.0.1:{q}", "--no-table", *flags,
            ],
            name=name,
            env={"KAFKATUNNEL_STATE_DIR": f"/tmp/kafkatunnel-bench-{os.getpid()}", **code},
        )  # fmt: skip
        up.wait_for_line(r"^bootstrap\.servers=", timeout=30)
        tunneled.processes.append(up)
        tunneled.scratch = scratch
        paths.append(tunneled)
    return paths


def start_tls_paths() -> list[Path_]:
    """A client speaking TLS itself, and a TLS-originating relay: each to an OpenSSL
    listener in front of its own broker, with a certificate for 127.0.0.1."""
    from tests.pki import TestAuthority

    directory = Path(tempfile.mkdtemp(prefix="kafkatunnel-bench-direct-tls-"))
    ca = TestAuthority(directory)
    server = ca.issue("broker", ["127.0.0.1"])
    verified = ssl.create_default_context(cafile=str(ca.pem))

    def front(port: int, broker_port: int) -> ManagedProcess:
        listener = ManagedProcess(
            ["socat", f"OPENSSL-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr,nodelay,"
             f"cert={server.cert},key={server.key},verify=0",
             f"TCP:127.0.0.1:{broker_port},nodelay"],
            name="socat-tls-listener",
        )  # fmt: skip
        listener.wait_accepting(port, timeout=30)
        return listener

    p, f = free_port(), free_port()
    direct = _path("direct-tls", f"127.0.0.1:{f}", p, f"127.0.0.1:{f}")
    direct.processes.insert(1, front(f, p))  # the broker's own TLS: not a relay
    direct.cluster_side, direct.processes = [direct.processes[1]], direct.processes[:1]
    direct.client = {"security.protocol": "SSL", "ssl.ca.location": str(ca.pem)}
    direct.probe_tls = verified

    p, f, r = free_port(), free_port(), free_port()
    relayed = _path("socat-tls", f"127.0.0.1:{r}", p, f"127.0.0.1:{r}")
    relayed.cluster_side = [front(f, p)]
    relay = ManagedProcess(
        ["socat", f"TCP-LISTEN:{r},bind=127.0.0.1,fork,reuseaddr,nodelay",
         f"OPENSSL:127.0.0.1:{f},cafile={ca.pem},nodelay"],
        name="socat-tls-relay",
    )  # fmt: skip
    relay.wait_accepting(r, timeout=30)
    relayed.processes.append(relay)
    return [direct, relayed]


def _tls_listener(broker_port: int) -> tuple[int, ManagedProcess, Path]:
    """socat's OpenSSL listener in front of the broker, with a certificate for the broker's
    advertised name from a CA made here: its port, its process, the CA's PEM."""
    from tests.pki import TestAuthority

    directory = Path(tempfile.mkdtemp(prefix="kafkatunnel-bench-tls-"))
    ca = TestAuthority(directory)
    server = ca.issue("broker", [TANSU_HOST])
    port = free_port()
    terminator = ManagedProcess(
        [
            "socat",
            f"OPENSSL-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr,nodelay,"
            f"cert={server.cert},key={server.key},verify=0",
            f"TCP:127.0.0.1:{broker_port},nodelay",
        ],
        name="socat-tls",
    )
    terminator.wait_accepting(port, timeout=30)
    return port, terminator, ca.pem


def produce(
    bootstrap: str, topic: str, count: int, pace: float = 0, client: dict[str, str] | None = None
) -> float:
    """MB/s produced; pace: at most this many MB/s (0: as fast as it goes)."""
    payload = random.randbytes(VALUE)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "batch.size": 1_000_000,
         **(client or {})}
    )  # fmt: skip
    producer.produce(topic, b"warm-up")
    producer.flush(30)
    per_second = pace * 1e6 / VALUE
    start = time.perf_counter()
    for index in range(count):
        if per_second and not index % 1000:  # on schedule, a thousand messages at a time
            due = start + index / per_second
            while (now := time.perf_counter()) < due:
                producer.poll(min(0.001, due - now))
        while True:
            try:
                producer.produce(topic, payload)
                break
            except BufferError:
                producer.poll(0.001)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - start
    if remaining:
        raise RuntimeError(f"{remaining} messages not delivered to {bootstrap}")
    return count * VALUE / elapsed / 1e6


def consume(bootstrap: str, topic: str, count: int, client: dict[str, str] | None = None) -> float:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
         "enable.auto.commit": False, "fetch.max.bytes": 52428800, **(client or {})}
    )  # fmt: skip
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign(
        [
            confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
            for p in partitions
        ]
    )
    seen = 0
    start: float | None = None
    deadline = time.monotonic() + 120
    while seen < count + 1 and time.monotonic() < deadline:
        for message in consumer.consume(10000, 1.0):
            if message.error() is None:
                if start is None:
                    start = time.perf_counter()
                seen += 1
    elapsed = time.perf_counter() - (start or time.perf_counter())
    consumer.close()
    if seen < count + 1:
        raise RuntimeError(f"consumed {seen} of {count + 1} from {bootstrap}")
    return count * VALUE / elapsed / 1e6


TRIPS = ("metadata", "produce", "fetch")  # the round trips whose latency is measured


def latency(
    bootstrap: str, requests: int, topic: str, tls: ssl.SSLContext | None = None
) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of round trips on one connection, each kind in a row: Metadata for
    no topic (which the proxies that rewrite must parse), a small Produce (one 100-byte
    record, acks=1) and a Fetch of that record (what applications wait on)."""

    def connect(host: str, port: int, timeout: float) -> socket.socket:
        sock = socket.create_connection((host, port), timeout=timeout)
        return sock if tls is None else tls.wrap_socket(sock, server_hostname=host)

    out = {}
    with ProbeConnection(bootstrap, connect=connect) as probe:
        probe.brokers()
        written = probe.request(_produce(topic))  # where our small records land
        offset = int(written.responses[0].partition_responses[0].base_offset)
        frames = {
            "metadata": encode_request(_untyped(load_request_schema(3, 1))[0](topics=()), 1),
            "produce": encode_request(_produce(topic), 2),
            "fetch": encode_request(_fetch(topic, offset), 3),
        }
        for kind in TRIPS:
            samples = []
            for _ in range(requests):
                start = time.perf_counter_ns()
                probe.sock.sendall(frames[kind])
                _read_frame(probe.sock)
                samples.append((time.perf_counter_ns() - start) / 1e6)
            samples.sort()
            out[kind] = statistics.median(samples), samples[int(len(samples) * 0.99) - 1]
    return out


def interleaved(paths: list[Path_], requests: int) -> None:
    """Round trips on every path in turn, one at a time (in a new random order each turn), so
    that whatever the machine does meanwhile falls on every path alike: the small
    differences between relays are not lost in the spread from one measurement to the
    next. Prints p50 and p99 added over direct per kind, and each relay's CPU per round
    trip (every thread's, in the scheduler's nanoseconds)."""
    probes, frames = [], []
    for path in paths:
        tls = path.probe_tls

        def connect(host: str, port: int, timeout: float, tls: Any = tls) -> socket.socket:
            sock = socket.create_connection((host, port), timeout=timeout)
            return sock if tls is None else tls.wrap_socket(sock, server_hostname=host)

        probe = ProbeConnection(path.bootstrap, connect=connect)
        probe.brokers()
        topic = f"interleaved-{uuid.uuid4().hex[:6]}"
        written = probe.request(_produce(topic))
        offset = int(written.responses[0].partition_responses[0].base_offset)
        probes.append(probe)
        frames.append({
            "metadata": encode_request(_untyped(load_request_schema(3, 1))[0](topics=()), 1),
            "produce": encode_request(_produce(topic), 2),
            "fetch": encode_request(_fetch(topic, offset), 3),
        })  # fmt: skip
    samples: dict[str, dict[str, list[float]]] = {p.name: {k: [] for k in TRIPS} for p in paths}
    cpu: dict[str, float] = {}
    order = list(range(len(paths)))
    for kind in TRIPS:
        before = {p.name: cpu_times(p.relay_pids()) for p in paths}
        for _ in range(requests):
            random.shuffle(order)
            for index in order:
                sock, frame = probes[index].sock, frames[index][kind]
                start = time.perf_counter_ns()
                sock.sendall(frame)
                _read_frame(sock)
                samples[paths[index].name][kind].append((time.perf_counter_ns() - start) / 1e6)
        for path in paths:
            used = cpu_used(before[path.name], cpu_times(path.relay_pids()))
            cpu[path.name] = cpu.get(path.name, 0.0) + used
    for probe in probes:
        probe.close()
    direct = {k: _percentiles(samples[paths[0].name][k]) for k in TRIPS}
    print(f"\n{requests:,} round trips of each kind per path, interleaved\n")
    print("| added over direct, p50 / p99 ms | " + " | ".join(TRIPS) + " | relay CPU per trip |")
    print("| --- |" + " ---: |" * (len(TRIPS) + 1))
    for path in paths:
        cells = []
        for kind in TRIPS:
            p50, p99 = _percentiles(samples[path.name][kind])
            cells.append(f"{p50 - direct[kind][0]:+.3f} / {p99 - direct[kind][1]:+.3f}")
        per_trip = cpu[path.name] * 1e6 / (requests * len(TRIPS))
        print(f"| {path.name} | " + " | ".join(cells) + f" | {per_trip:.1f} us |")


def refreshes(paths: list[Path_], count: int, between: int) -> None:
    """A producer's answers beside metadata refreshes, on every path in turn (a new random
    order each turn, as interleaved()): `between` Produce v11 requests on one connection,
    all in flight at once as a producer's are, then one Metadata v12 round trip for the
    producer's topic on another connection to the same tunnel, timed. A Produce v11 answer
    names brokers (its leader endpoints), so the tunnel holds it whole and walks it, as it
    does a Metadata answer; only the Metadata answer is the same each time. Prints the
    Metadata round trip and the produce batch added over direct, and each relay's CPU per
    refresh and per produce answer (measured around each, every thread's)."""
    producers, refreshers, batches, asks, pids = [], [], [], [], []
    for path in paths:
        producer, refresher = ProbeConnection(path.bootstrap), ProbeConnection(path.bootstrap)
        topic = f"refreshed-{uuid.uuid4().hex[:6]}"
        producer.request(_produce(topic, produce_v11))  # the topic exists before it is asked
        batch = _produce(topic, produce_v11)
        batches.append(b"".join(encode_request(batch, 100 + n) for n in range(between)))
        ask = MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name=topic),),  # type: ignore[arg-type]
                              allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False)  # fmt: skip
        asks.append(encode_request(ask, 1))
        producers.append(producer)
        refreshers.append(refresher)
        pids.append(path.relay_pids())
    kinds = ("metadata", "produce")
    samples: dict[str, dict[str, list[float]]] = {p.name: {k: [] for k in kinds} for p in paths}
    cpu: dict[str, dict[str, float]] = {p.name: dict.fromkeys(kinds, 0.0) for p in paths}
    order = list(range(len(paths)))
    for _ in range(count):
        random.shuffle(order)
        for index in order:
            name = paths[index].name
            for kind, sock, frames, answers in (
                ("produce", producers[index].sock, batches[index], between),
                ("metadata", refreshers[index].sock, asks[index], 1),
            ):
                before = cpu_times(pids[index])
                start = time.perf_counter_ns()
                sock.sendall(frames)
                for _ in range(answers):
                    _read_frame(sock)
                samples[name][kind].append((time.perf_counter_ns() - start) / 1e6)
                cpu[name][kind] += cpu_used(before, cpu_times(pids[index]))
    for probe in producers + refreshers:
        probe.close()
    direct = {k: _percentiles(samples[paths[0].name][k]) for k in kinds}
    (refresh_p50, refresh_p99), (batch_p50, batch_p99) = direct["metadata"], direct["produce"]
    print(f"\n{count:,} refreshes per path, each after {between} produce answers, interleaved; "
          f"direct: a refresh p50 {refresh_p50:.3f} / p99 {refresh_p99:.3f} ms, a batch "
          f"{batch_p50:.3f} / {batch_p99:.3f} ms\n")  # fmt: skip
    print("| added over direct, p50 / p99 ms | metadata refresh | produce batch "
          "| relay CPU per refresh | per produce answer |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: |")
    for path in paths:
        cells = []
        for kind in kinds:
            p50, p99 = _percentiles(samples[path.name][kind])
            cells.append(f"{p50 - direct[kind][0]:+.3f} / {p99 - direct[kind][1]:+.3f}")
        per_refresh = cpu[path.name]["metadata"] * 1e6 / count
        per_answer = cpu[path.name]["produce"] * 1e6 / (count * between)
        print(f"| {path.name} | " + " | ".join(cells)
              + f" | {per_refresh:.1f} us | {per_answer:.1f} us |")  # fmt: skip


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1]


def _produce(topic: str, schema: Any = produce_v9) -> Any:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)  # fmt: skip
    builder.append(0, timestamp=None, key=None, value=b"v" * 100, headers=[])
    request, topic_data, partition_data = _untyped(
        schema.ProduceRequest, schema.TopicProduceData, schema.PartitionProduceData
    )
    data = partition_data(index=0, records=bytes(builder.build()))
    return request(
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(topic_data(name=topic, partition_data=(data,)),),
    )


def _fetch(topic: str, offset: int) -> Any:
    request, fetch_topic, fetch_partition = _untyped(FetchRequest, FetchTopic, FetchPartition)
    partition = fetch_partition(
        partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=4096,
    )  # fmt: skip
    return request(
        cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0,
        max_bytes=4096, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(fetch_topic(topic=topic, partitions=(partition,)),), forgotten_topics_data=(),
        rack_id="",
    )  # fmt: skip


def _untyped(*types: type) -> tuple[Any, ...]:
    """kio's classes, called with plain ints (kio's NewTypes are for its own encoders)."""
    return types


def _read_frame(sock: socket.socket) -> bytes:
    """One whole response frame from a blocking socket."""
    head = _read_exactly(sock, 4)
    return _read_exactly(sock, int.from_bytes(head, "big"))


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the connection closed mid-answer")
        data += chunk
    return bytes(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument(
        "--tunnels",
        default="uvloop,uvloop-copy,asyncio",
        help="kafkatunnel variants, each a path: LOOP (uvloop, asyncio), -copy: --no-zero-copy, "
        "-record: --record DIR, -record-payloads: --record DIR --record-payloads, -tls: --tls "
        "to a TLS listener in front of the broker; a variant "
        "ending in -baseline runs from the --baseline tree",
    )
    parser.add_argument("--paths", default="", help="only these paths (comma-separated names)")
    parser.add_argument(
        "--tls-paths",
        action="store_true",
        help="also direct-tls (the client speaks TLS itself) and socat-tls (a TLS-originating "
        "relay): what a -tls tunnel variant is judged against",
    )
    parser.add_argument(
        "--baseline",
        help="run the variants ending in -baseline (uvloop-baseline if none does) from this "
        "source tree, e.g. a git worktree of an earlier commit",
    )
    parser.add_argument(
        "--pace",
        type=float,
        default=0,
        help="produce at this many MB/s instead of as fast as it goes: relay CPU per MB for "
        "the same traffic on every path (a saturated run's depends on how reads fall)",
    )
    parser.add_argument(
        "--idle",
        type=int,
        default=0,
        metavar="N",
        help="instead of traffic: the memory and descriptors each of N idle client "
        "connections costs every kafkatunnel path (each answered once, so its upstream and "
        "any TLS session are open)",
    )
    parser.add_argument(
        "--interleaved",
        type=int,
        default=0,
        metavar="N",
        help="instead of throughput: N round trips of each kind on every path, in turn, one "
        "at a time (latency differences too small for separate measurements to show)",
    )
    parser.add_argument(
        "--refreshes",
        type=int,
        default=0,
        metavar="N",
        help="instead of throughput: N metadata refreshes on every path, in turn, each after "
        "a batch of produce answers on another connection (--between)",
    )
    parser.add_argument(
        "--between",
        type=int,
        default=100,
        metavar="K",
        help="with --refreshes: Produce v11 requests in flight at once before each refresh "
        "(default 100, more than the tunnel keeps answers)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also python-floor (scripts/floor_relay.py): a relay on uvloop that only reads "
        "and writes, what any relay in Python pays",
    )
    parser.add_argument(
        "--same-broker",
        action="store_true",
        help="keep each path's broker across rounds: it slows as its in-memory log grows, "
        "so relays write to a broker that often cannot take more (a slow upstream)",
    )
    args = parser.parse_args()
    tunnels = args.tunnels.split(",")
    if args.baseline and not any(t.endswith("baseline") for t in tunnels):
        tunnels.append("uvloop-baseline")
    paths = start_paths(tunnels, args.baseline, floor=args.floor)
    if args.tls_paths:
        paths += start_tls_paths()
    if args.paths:
        wanted = set(args.paths.split(","))
        for path in paths:
            if path.name not in wanted:
                for process in path.processes:
                    process.stop()
        paths = [p for p in paths if p.name in wanted]
    if args.interleaved:
        try:
            interleaved(paths, args.interleaved)
        finally:
            for path in paths:
                for process in path.processes + path.cluster_side:
                    process.stop()
        return
    if args.refreshes:
        try:
            refreshes(paths, args.refreshes, args.between)
        finally:
            for path in paths:
                for process in path.processes + path.cluster_side:
                    process.stop()
        return
    if args.idle:
        try:
            idle_cost([p for p in paths if p.name.startswith("kafkatunnel")], args.idle)
        finally:
            for path in paths:
                for process in path.processes + path.cluster_side:
                    process.stop()
        return
    try:
        direct, others = paths[0], paths[1:]
        for round_ in range(args.rounds):
            random.shuffle(others)
            before = measure(direct, round_, args)
            for path in others:
                mine = measure(path, round_, args)
                after = measure(direct, round_, args)
                path.compare(mine, before, after)
                before = after
    finally:
        for path in paths:
            for process in path.processes + path.cluster_side:
                process.stop()
    report(paths, args)


def idle_cost(paths: list[Path_], count: int) -> None:
    """Per idle client connection: the tunnel process's resident memory and descriptors,
    measured with `count` connections open against none, each connection having had one
    Metadata answer (so its upstream, and any TLS session, is established)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * count + 256)), hard))
    print("\n| path | connections | memory per idle connection | descriptors per connection |")
    print("| --- | ---: | ---: | ---: |")
    for path in paths:
        tunnel = path.processes[1].pid
        before_rss, before_fds = _resident_kib(tunnel), len(os.listdir(f"/proc/{tunnel}/fd"))
        opened = []
        try:
            for _ in range(count):
                probe = ProbeConnection(path.bootstrap, timeout=30)
                opened.append(probe)
                probe.brokers()
            time.sleep(1)  # nothing pending: what is left is what an idle connection holds
            rss, fds = _resident_kib(tunnel), len(os.listdir(f"/proc/{tunnel}/fd"))
        finally:
            for probe in opened:
                probe.close()
        per = (rss - before_rss) / count
        print(f"| {path.name} | {count} | {per:.1f} KiB | {(fds - before_fds) / count:.1f} |")


def _resident_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


@dataclass(frozen=True)
class Sample:
    produce: float
    consume: float
    p50: float
    p99: float
    trips: dict[str, tuple[float, float]]  # round trip kind -> p50, p99 (ms)


def measure(path: Path_, round_: int, args: argparse.Namespace) -> Sample:
    if not args.same_broker:
        path.fresh_broker()
    topic = f"bench-{round_}-{uuid.uuid4().hex[:6]}"
    before = cpu_times(path.relay_pids())
    path.produce.append(produce(path.bootstrap, topic, args.messages, args.pace, path.client))
    used = cpu_used(before, cpu_times(path.relay_pids()))
    path.relay_cpu.append(used * 1000 / (args.messages * VALUE / 1e6))
    path.consume.append(consume(path.bootstrap, topic, args.messages, path.client))
    trips = latency(path.bootstrap, args.requests, topic, path.probe_tls)
    p50, p99 = trips["metadata"]
    path.p50.append(p50)
    path.p99.append(p99)
    print(
        f"round {round_ + 1} {path.name:12} produce {path.produce[-1]:7.1f} MB/s  "
        f"consume {path.consume[-1]:7.1f} MB/s  p50 {p50:.3f} ms  p99 {p99:.3f} ms  "
        f"relay CPU {path.relay_cpu[-1]:.2f} ms/MB",
        flush=True,
    )
    print(
        "         " + "  ".join(f"{k} p50 {a:.3f} p99 {b:.3f}" for k, (a, b) in trips.items()),
        flush=True,
    )
    return Sample(path.produce[-1], path.consume[-1], p50, p99, trips)


def report(paths: list[Path_], args: argparse.Namespace) -> None:
    direct = paths[0]
    med = statistics.median
    print(f"\n{args.rounds} rounds, {args.messages:,} x {VALUE} B, acks=1; medians over rounds\n")
    print(
        "| path | produce MB/s | vs direct | consume MB/s | vs direct | p50 ms | p99 ms | added "
        "| relay CPU ms/MB |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for path in paths:
        mine = path is not direct
        cells = [
            path.name,
            f"{med(path.produce):.0f}",
            f"{med(path.produce_ratio):.0%}" if mine else "100%",
            f"{med(path.consume):.0f}",
            f"{med(path.consume_ratio):.0%}" if mine else "100%",
            f"{med(path.p50):.3f}",
            f"{med(path.p99):.3f}",
            f"{med(path.p99_added):+.3f}" if mine else "+0.000",
            f"{med(path.relay_cpu):.2f}",
        ]
        print("| " + " | ".join(cells) + " |")
    print("\nround by round, vs the direct runs either side (produce / consume / added p99):")
    for path in paths[1:]:
        rows = zip(path.produce_ratio, path.consume_ratio, path.p99_added, strict=True)
        print(f"  {path.name}: " + ", ".join(f"{p:.0%}/{c:.0%}/{a:+.2f}" for p, c, a in rows))
    report_round_trips(paths)
    report_recording(paths)
    report_tls(paths)
    report_baseline(paths)


def report_round_trips(paths: list[Path_]) -> None:
    """The latency each path adds over the direct runs either side, per round trip kind:
    medians over rounds of p50 and p99 added."""
    med = statistics.median
    print("\n| round trip: added over direct, p50 / p99 ms | " + " | ".join(TRIPS) + " |")
    print("| --- |" + " ---: |" * len(TRIPS))
    for path in paths[1:]:
        cells = []
        for kind in TRIPS:
            added = path.trips_added.get(kind, [])
            cells.append(f"{med(a[0] for a in added):+.3f} / {med(a[1] for a in added):+.3f}"
                         if added else "-")  # fmt: skip
        print(f"| {path.name} | " + " | ".join(cells) + " |")


def report_baseline(paths: list[Path_]) -> None:
    """Each variant against the same variant run from the --baseline tree, round by round:
    throughput ratios (each to its own direct runs) divided, the latency each adds over
    direct, and relay CPU per MB divided."""
    by_name = {p.name: p for p in paths}
    names = {"kafkatunnel-uvloop": "kafkatunnel"}  # the uvloop variant's name (start_paths)
    pairs = [
        (by_name[names.get(variant, variant)], p)
        for p in paths
        if p.name.endswith("-baseline") and (variant := p.name.removesuffix("-baseline"))
    ]
    if not pairs:
        return
    med = statistics.median
    print("\n| this tree vs --baseline | produce | consume | p50 added ms | p99 added ms "
          "| relay CPU per MB |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for mine, base in pairs:
        produce = [a / b for a, b in zip(mine.produce_ratio, base.produce_ratio, strict=True)]
        consume = [a / b for a, b in zip(mine.consume_ratio, base.consume_ratio, strict=True)]
        cpu = [a / b for a, b in zip(mine.relay_cpu, base.relay_cpu, strict=True)]
        cells = [
            f"{med(produce):.0%}", f"{med(consume):.0%}",
            f"{med(mine.p50_added):+.3f} vs {med(base.p50_added):+.3f}",
            f"{med(mine.p99_added):+.3f} vs {med(base.p99_added):+.3f}", f"{med(cpu):.2f}x",
        ]  # fmt: skip
        print(f"| {mine.name} | " + " | ".join(cells) + " |")


def report_tls(paths: list[Path_]) -> None:
    """The TLS tunnel against a client speaking TLS itself and against a TLS-originating
    relay, round by round: throughput ratios (each to its own direct runs) divided, relay
    CPU per MB divided, and the p99 added over the client's own TLS."""
    by_name = {p.name: p for p in paths}
    direct_tls, relay = by_name.get("direct-tls"), by_name.get("socat-tls")
    tunnels = [p for p in paths if p.name.startswith("kafkatunnel") and p.name.endswith("-tls")]
    if direct_tls is None or not tunnels:
        return
    med = statistics.median
    header = ["TLS path vs direct TLS", "produce", "consume", "p99 added ms", "CPU vs socat-tls"]
    print("\n| " + " | ".join(header) + " |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for path in [*tunnels, *([relay] if relay else [])]:
        produce = [a / b for a, b in zip(path.produce_ratio, direct_tls.produce_ratio, strict=True)]
        consume = [a / b for a, b in zip(path.consume_ratio, direct_tls.consume_ratio, strict=True)]
        added = [a - b for a, b in zip(path.p99_added, direct_tls.p99_added, strict=True)]
        cpu = (
            f"{med([a / b for a, b in zip(path.relay_cpu, relay.relay_cpu, strict=True)]):.2f}x"
            if relay is not None
            else "-"
        )
        cells = [f"{med(produce):.0%}", f"{med(consume):.0%}", f"{med(added):+.3f}", cpu]
        print(f"| {path.name} | " + " | ".join(cells) + " |")


def report_recording(paths: list[Path_]) -> None:
    """Recording and TLS variants against the plain tunnel, round by round: each one's
    ratio to its own direct runs, divided by the tunnel's, and relay CPU per MB divided."""
    plain = next((p for p in paths if p.name == "kafkatunnel"), None)
    recorded = [p for p in paths if p.name.startswith("kafkatunnel-")
                and ("record" in p.name or "tls" in p.name)]  # fmt: skip
    if plain is None or not recorded:
        return
    med = statistics.median
    print("\n| variant vs the plain tunnel | produce | consume | relay CPU per MB |")
    print("| --- | ---: | ---: | ---: |")
    rounds = []
    for path in recorded:
        produce = [a / b for a, b in zip(path.produce_ratio, plain.produce_ratio, strict=True)]
        consume = [a / b for a, b in zip(path.consume_ratio, plain.consume_ratio, strict=True)]
        cpu = [a / b for a, b in zip(path.relay_cpu, plain.relay_cpu, strict=True)]
        print(f"| {path.name} | {med(produce):.0%} | {med(consume):.0%} | {med(cpu):.2f}x |")
        cells = zip(produce, consume, cpu, strict=True)
        rounds.append(
            f"  {path.name}: " + ", ".join(f"{p:.0%}/{c:.0%}/{u:.2f}x" for p, c, u in cells)
        )
    print("\nround by round (produce / consume / relay CPU, vs the plain tunnel):")
    print("\n".join(rounds))


if __name__ == "__main__":
    main()
