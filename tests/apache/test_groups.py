"""Every kind of group Kafka 4 has, through the tunnel and judged by `kafkatunnel verify` on
Apache Kafka: share groups (KIP-932) on every coordinator, recorded through `up` and captured
through the one-forward workaround; groups of every kind whose coordinator is restarted
under them, and a client that rebootstraps (KIP-1242) when the tunnel comes back with its
brokers on other ports, which a CI gate must not call misrouted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kafkatunnel.demo import free_port_run
from kafkatunnel.demo.apache import JIT, OneForward
from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.demo.workload import consume_group, produce, produce_transaction
from kafkatunnel.protocol import api_title
from kafkatunnel.verify.events import LOOKUP, MISDIRECTED
from kafkatunnel.verify.job import decode_path, expand
from kafkatunnel.waiting import DeadlineExceeded, NeverHolds, wait_for
from tests.apache.test_apache_kafka import tunnel
from tests.apache.test_clients import api_requests
from tests.apache.test_verify import one_partition_led_by_broker_0
from tests.worlds.apache import LISTENERS, ApacheKafka

MESSAGES = 20
SHARE_GROUPS = "org.apache.kafka.tools.consumer.group.ShareGroupCommand"
CONFIGS = "org.apache.kafka.tools.ConfigCommand"
LEADER_ELECTION = "org.apache.kafka.tools.LeaderElectionCommand"
FETCH, SYNC_GROUP, CONSUMER_GROUP_HEARTBEAT, SHARE_GROUP_HEARTBEAT = 1, 14, 68, 76


def judged(path: Path, *flags: str) -> tuple[int, dict[str, dict[str, Any]], str]:
    """verify's exit code, its report of each group and transactional id, and what it said."""
    result = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--in-process", "--json", "-", *flags,
         str(path)], capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    report = json.loads(result.stdout)
    return result.returncode, {g["key"]: g for g in report["groups"]}, result.stderr


def share_from_earliest(kafka: ApacheKafka, groups: list[str]) -> None:
    """Each share group starts at the earliest record (Kafka's default is the latest), set
    with Kafka's own kafka-configs, as a user does before the group's first member joins."""

    def set_one(group: str) -> None:
        kafka.tool(CONFIGS, "--bootstrap-server", kafka.bootstrap(), "--alter",
                   "--entity-type", "groups", "--entity-name", group,
                   "--add-config", "share.auto.offset.reset=earliest")  # fmt: skip

    with ThreadPoolExecutor(len(groups)) as pool:
        list(pool.map(set_one, groups))


def share_consumer(classpath: str, bootstrap: str, topic: str, group: str, count: int,
                   seconds: int) -> list[str]:  # fmt: skip
    """The Java client's KafkaShareConsumer: reads until `count` distinct records or
    `seconds`, acknowledges them, and says CONSUMED n."""
    return ["java", "-Xmx256m", JIT, "-cp", classpath, "JavaClient", "share", bootstrap, topic,
            group, str(count), str(seconds)]  # fmt: skip


def consumed(result: subprocess.CompletedProcess[str]) -> int:
    for line in result.stdout.splitlines():
        if line.startswith("CONSUMED "):
            return int(line.split()[1])
    raise AssertionError(f"no CONSUMED line: {result.stdout[-500:]} {result.stderr[-2000:]}")


def test_share_groups_on_every_coordinator_recorded_and_through_one_forward(
    apache_kafka: ApacheKafka, java_classes: str, tmp_path: Path
) -> None:
    """Through `up --record`: a share group per coordinator reads and acknowledges every
    record, kafka-share-groups describes them through the tunnel, and verify --strict judges
    each ok, as a share group. Through one forward to broker 0, captured by tcpdump: the
    share groups broker 1 and 2 coordinate read nothing, and verify names them misrouted:
    broker 0 refused the connections meant for their coordinators (KIP-1242)."""
    topic = one_partition_led_by_broker_0(apache_kafka)
    groups = {n: g for n, (g,) in apache_kafka.groups_by_coordinator(1, f"{topic}-s").items()}
    later = {n: g for n, (g,) in apache_kafka.groups_by_coordinator(1, f"{topic}-f").items()}
    share_from_earliest(apache_kafka, [*groups.values(), *later.values()])

    recording = tmp_path / "recording"
    with tunnel(apache_kafka, "plain", "--record", str(recording)) as bootstrap:
        assert produce(bootstrap, topic, MESSAGES) == MESSAGES

        def read(group: str) -> int:
            argv = share_consumer(java_classes, bootstrap, topic, group, MESSAGES, 60)
            return consumed(subprocess.run(argv, capture_output=True, text=True, timeout=150))

        with ThreadPoolExecutor(len(groups)) as pool:
            read_by = dict(zip(groups, pool.map(read, groups.values()), strict=True))
        assert read_by == {0: MESSAGES, 1: MESSAGES, 2: MESSAGES}, read_by
        described = subprocess.run(
            ["java", "-Xmx256m", JIT, "-cp", java_classes, SHARE_GROUPS, "--bootstrap-server",
             bootstrap, "--describe", "--group", groups[2]],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert described.returncode == 0, described.stderr[-2000:]
        assert groups[2] in described.stdout and topic in described.stdout, described.stdout
    code, verdicts, said = judged(recording, "--strict")
    assert code == 0, said
    for node, group in groups.items():
        verdict = verdicts[group]
        assert (verdict["verdict"], verdict["group_type"]) == ("ok", "share"), (node, verdict)
        assert verdict["coordinator"] == node, verdict

    capture = tmp_path / "one-forward.pcap"
    with OneForward(apache_kafka, capture) as forward:

        def read_through_one(group: str) -> int:
            argv = share_consumer(java_classes, forward.bootstrap, topic, group, MESSAGES, 15)
            return consumed(forward.run(*argv, timeout=120))

        with ThreadPoolExecutor(len(later)) as pool:
            read_by = dict(zip(later, pool.map(read_through_one, later.values()), strict=True))
    assert read_by == {0: MESSAGES, 1: 0, 2: 0}, read_by
    # The brokers behind the capture's one address inferred from what it answered, and
    # told by the user (`--broker`: the forward leads to broker 0): the same verdicts.
    for told in ([], ["--broker", f"127.0.0.1:{LISTENERS['plain']}=0"]):
        code, verdicts, said = judged(capture, "--strict", *told)
        assert code != 0, said
        first = verdicts[later[0]]
        assert (first["verdict"], first["group_type"]) == ("ok", "share"), (told, first)
        for node in (1, 2):
            # Kafka 4.4's client names the node it means (KIP-1242): broker 0 refuses the
            # connection with REBOOTSTRAP_REQUIRED before any share-group request, so the
            # capture holds the group's look-ups and the refusals, not its kind.
            verdict = verdicts[later[node]]
            assert verdict["verdict"] == "misrouted", (told, verdict)
            assert "REBOOTSTRAP_REQUIRED" in " ".join(verdict["reasons"]), verdict
            assert later[node] in said, said


def test_groups_of_every_kind_whose_coordinator_restarts_are_judged_ok(
    apache_kafka: ApacheKafka, java_classes: str, tmp_path: Path
) -> None:
    """A classic, a consumer and a share group, all coordinated by broker 1, consume through
    `up --record` while broker 1 is restarted and then made leader again: their coordinator
    moves to another broker and back, and the brokers taking over answer NOT_COORDINATOR or
    COORDINATOR_LOAD_IN_PROGRESS while they load. Every record is read, and verify --strict
    judges each group ok: the recording's listeners show where each request went."""
    topic = f"apache-restart-{uuid.uuid4().hex[:6]}"
    apache_kafka.tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                      apache_kafka.bootstrap(), "--create", "--topic", topic, "--partitions",
                      "3", "--replication-factor", "3")  # fmt: skip
    kinds = ("classic", "consumer", "share")
    groups = {kind: apache_kafka.groups_by_coordinator(1, f"{topic}-{kind}")[1][0]
              for kind in kinds}  # fmt: skip
    share_from_earliest(apache_kafka, [groups["share"]])
    total = 2 * MESSAGES

    recording = tmp_path / "recording"
    with tunnel(apache_kafka, "plain", "--record", str(recording)) as bootstrap:
        assert produce(bootstrap, topic, MESSAGES, prefix="before") == MESSAGES

        def group(kind: str) -> Callable[[], int]:
            if kind == "share":
                argv = share_consumer(java_classes, bootstrap, topic, groups[kind], total, 150)
                return lambda: consumed(
                    subprocess.run(argv, capture_output=True, text=True, timeout=240)
                )
            config = {"group.protocol": kind}
            # a member expired while its coordinator moves is delivered records again
            return lambda: len(set(consume_group(bootstrap, groups[kind], topic, total,
                                                 timeout=150, config=config,
                                                 dedupe_by_offset=True).values))  # fmt: skip

        with ThreadPoolExecutor(len(kinds)) as pool:
            running = {kind: pool.submit(group(kind)) for kind in kinds}

            seen: list[dict[str, int]] = [{}]

            def joined() -> bool:
                sent = api_requests(bootstrap)
                # a classic member syncs once; the others heartbeat from their first request
                beats = {SYNC_GROUP: 1, CONSUMER_GROUP_HEARTBEAT: 2, SHARE_GROUP_HEARTBEAT: 2}
                seen[0] = {api_title(api): sent[api_title(api)] for api in beats}
                return all(sent[api_title(api)] >= least for api, least in beats.items())

            try:
                wait_for(joined, timeout=90, interval=0.5, what="each group to have members")
            except DeadlineExceeded as late:
                raise AssertionError(f"{late}; requests through the tunnel: {seen[0]}") from late
            apache_kafka.restart(1)
            apache_kafka.tool(LEADER_ELECTION, "--bootstrap-server", apache_kafka.bootstrap(),
                              "--election-type", "preferred", "--all-topic-partitions")  # fmt: skip
            assert produce(bootstrap, topic, MESSAGES, prefix="after") == MESSAGES
            read = {kind: future.result(timeout=300) for kind, future in running.items()}
    assert read == dict.fromkeys(kinds, total), read

    code, verdicts, said = judged(recording, "--strict")
    assert code == 0, said
    for kind, key in groups.items():
        verdict = verdicts[key]
        assert (verdict["verdict"], verdict["group_type"]) == ("ok", kind), verdict
        named = {m["broker"] for m in verdict["timeline"] if m["api"] == "FindCoordinator"}
        assert 1 in named and len(named) >= 2, (kind, named)  # moved away, and back
        assert sum(verdict["errors"].values()) >= 1, verdict  # it met a coordinator moving


def test_the_first_groups_of_a_new_cluster_are_judged_ok(java_classes: str, tmp_path: Path) -> None:
    """A new cluster's first minute: groups of every kind and a transactional id start at
    once through `up --record` before `__consumer_offsets` and `__transaction_state` exist.
    Their look-ups create them: FindCoordinator answers COORDINATOR_NOT_AVAILABLE while they
    are made, and the broker it then names may answer NOT_COORDINATOR or
    COORDINATOR_LOAD_IN_PROGRESS until it has loaded them. The recording's listener shows
    every request reached that broker: verify --strict judges each ok, never misrouted."""
    topic = f"first-{uuid.uuid4().hex[:6]}"
    kinds = ("classic", "consumer", "share")
    recording = tmp_path / "recording"
    with ApacheKafka(nodes=1, offsets_topic=False) as fresh:
        groups = {kind: f"{topic}-{kind}" for kind in kinds}
        share_from_earliest(fresh, [groups["share"]])
        with tunnel(fresh, "plain", "--record", str(recording)) as bootstrap:
            assert produce(bootstrap, topic, MESSAGES) == MESSAGES

            def group(kind: str) -> Callable[[], int]:
                if kind == "share":
                    argv = share_consumer(java_classes, bootstrap, topic, groups[kind],
                                          MESSAGES, 60)  # fmt: skip
                    return lambda: consumed(
                        subprocess.run(argv, capture_output=True, text=True, timeout=150)
                    )
                config = {"group.protocol": kind}
                return lambda: len(set(consume_group(
                    bootstrap, groups[kind], topic, MESSAGES, timeout=60, config=config,
                    dedupe_by_offset=True,
                ).values))  # fmt: skip

            with ThreadPoolExecutor(len(kinds) + 1) as pool:
                running = {kind: pool.submit(group(kind)) for kind in kinds}
                transaction = pool.submit(produce_transaction, bootstrap, f"{topic}-t",
                                          f"{topic}-txn", 5, timeout=60)  # fmt: skip
                read = {kind: future.result(timeout=200) for kind, future in running.items()}
                transaction.result(timeout=200)
    assert read == dict.fromkeys(kinds, MESSAGES), read

    code, verdicts, said = judged(recording, "--strict")
    assert code == 0, said
    met = 0  # coordinator errors: the look-ups that found the topics not there yet
    for kind, key in [*groups.items(), ("transactional", f"{topic}-txn")]:
        verdict = verdicts[key]
        assert verdict["verdict"] == "ok", verdict
        assert verdict["group_type"] == (None if kind == "transactional" else kind), verdict
        met += sum(verdict["errors"].values())
    assert met >= 1, verdicts


@contextlib.contextmanager
def tunnel_on(
    kafka: ApacheKafka, listen: int, ports: dict[int, int], recording: Path
) -> Iterator[str]:
    """`kafkatunnel up --record` on a bootstrap port and broker ports (`--broker-port
    NODE=PORT`) the test chooses, so that a later run can take the same ports, or swap them."""
    pinned = [flag for node, port in sorted(ports.items())
              for flag in ("--broker-port", f"{node}={port}")]  # fmt: skip
    up = ManagedProcess(
        [sys.executable, "-m", "kafkatunnel", "up", "--no-table",
         "--bootstrap", kafka.bootstrap("plain"), "--exec", kafka.exec_template(),
         "--listen", f"127.0.0.1:{listen}", *pinned, "--record", str(recording)],
        name="kafkatunnel-up-apache-pinned",
    )  # fmt: skip
    try:
        yield up.wait_for_line(r"^bootstrap\.servers=(\S+)$", timeout=60).group(1)
    finally:
        up.stop()


def run_of(recording_file: str) -> str:
    """The tunnel run a recording file is from: kafkatunnel-STAMP-RUN-INDEX.pcapng."""
    return Path(recording_file).name.split("-")[2]


@contextlib.contextmanager
def loopback_capture(path: Path, ports: Iterable[int]) -> Iterator[None]:
    """tcpdump on the loopback, of the given tunnel ports: a recording leaves out the
    ApiVersions exchanges of Kafka 4.4's clients (v5, newer than the schemas it reads), so
    only a plain capture shows a broker refusing them."""
    only = " or ".join(f"tcp port {port}" for port in ports)
    tcpdump = ManagedProcess(["tcpdump", "-i", "lo", "-U", "-w", str(path), only],
                             name="tcpdump")  # fmt: skip
    try:
        tcpdump.wait_for_line(r"listening on lo", timeout=10)
        yield
    finally:
        tcpdump.stop()


@contextlib.contextmanager
def running(argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    """A client program, its output read at its end (communicate); killed if still running."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def test_a_java_client_that_rebootstraps_through_the_tunnel_is_judged_ok(
    apache_kafka: ApacheKafka, java_classes: str, tmp_path: Path
) -> None:
    """A recording of a Kafka 4.4 Java client that rebootstraps through the tunnel is judged
    ok. A classic consumer group, led and coordinated by broker 0, reads through `up
    --record`; the tunnel is stopped and started again on the same bootstrap port and
    recording directory with brokers 1 and 2 on each other's ports and broker 0 on a new
    one, while the client is paused (SIGSTOP: a laptop asleep). When it goes on, broker 0's
    old port leads nowhere and the only other brokers it knows, 1 and 2, are each behind the
    other's port: the broker there refuses the connection (ApiVersions v5 answered
    REBOOTSTRAP_REQUIRED, KIP-1242), and the client rebootstraps, looks its coordinator up
    again and reads every record. (A client awake through the restart finds no broker at
    all and rebootstraps without being refused, KIP-899; one whose old addresses all lead
    to other brokers can, once it has rebootstrapped and forgotten the cluster id, keep a
    connection to the wrong one.) verify --strict judges the group ok."""
    topic = one_partition_led_by_broker_0(apache_kafka)
    group = apache_kafka.groups_by_coordinator(1, f"{topic}-g")[0][0]
    listen = free_port_run(5)
    ports = {node: listen + 1 + node for node in range(3)}
    turned = {0: listen + 4, 1: ports[2], 2: ports[1]}
    recording, capture = tmp_path / "recording", tmp_path / "loopback.pcap"
    total = 2 * MESSAGES
    argv = ["java", "-Xmx256m", JIT, "-cp", java_classes, "JavaClient", "consume",
            f"127.0.0.1:{listen}", topic, group, str(total), "classic"]  # fmt: skip

    with contextlib.ExitStack() as first_tunnel:
        bootstrap = first_tunnel.enter_context(tunnel_on(apache_kafka, listen, ports, recording))
        assert produce(bootstrap, topic, MESSAGES, prefix="before") == MESSAGES
        with running(argv) as consumer:

            def reading() -> bool:
                if consumer.poll() is not None:
                    raise NeverHolds(f"the consumer ended early: {consumer.communicate()}")
                sent = api_requests(bootstrap)
                return sent[api_title(SYNC_GROUP)] >= 1 and sent[api_title(FETCH)] >= 1

            wait_for(reading, timeout=90, interval=0.5, what="the consumer to join and fetch")
            os.kill(consumer.pid, signal.SIGSTOP)
            first_tunnel.close()  # the tunnel stops while the client is paused
            (first_run,) = {run_of(f) for f in expand([str(recording)])}
            with (
                loopback_capture(capture, {*ports.values(), *turned.values()}),
                tunnel_on(apache_kafka, listen, turned, recording) as again,
            ):
                assert again == bootstrap, (again, bootstrap)
                os.kill(consumer.pid, signal.SIGCONT)
                assert produce(bootstrap, topic, MESSAGES, prefix="after") == MESSAGES
                out, err = consumer.communicate(timeout=200)
    assert consumed(subprocess.CompletedProcess(argv, consumer.returncode, out, err)) == total

    # It was refused: a connection meant for broker 1 or 2 reached the other (the capture's).
    refused = [e.node for e in decode_path(str(capture)).events if e.kind == MISDIRECTED]
    assert refused and set(refused) <= {1, 2}, refused
    files = expand([str(recording)])
    (second_run,) = {run_of(f) for f in files} - {first_run}
    looked_up = {(event.conn.run, event.node) for f in files for event in decode_path(f).events
                 if event.kind == LOOKUP and event.key == group}  # fmt: skip
    assert looked_up == {(first_run, 0), (second_run, 0)}, looked_up  # and again, after it
    code, verdicts, said = judged(recording, "--strict")
    assert code == 0, said
    verdict = verdicts[group]
    assert (verdict["verdict"], verdict["group_type"]) == ("ok", "classic"), verdict
    assert verdict["coordinator"] == 0, verdict
