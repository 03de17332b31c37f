"""verify on plain captures of real networks: tcpdump on a laptop whose clients reach the
cluster through relays (tests/verify/relays.py), no kafkatunnel. Which broker is behind each
relay address comes from the traffic itself, and the verdicts use it."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kafkatunnel.demo import LocalCluster
from kafkatunnel.demo.harness import TANSU_HOST
from kafkatunnel.verify.job import verify_local, verify_spark
from tests.verify.relays import RELAY_PORT, RelayedLaptop

WORKLOAD = [sys.executable, "-m", "kafkatunnel.demo.workload"]
TANSU_NODE = 111  # the node id tansu gives itself


@dataclass
class Plain:
    """A capture, the relay address of each mock broker, and each group's coordinator and
    what its consumer saw."""

    path: Path
    relays: dict[int, str]  # node id -> its relay's address
    coordinators: dict[str, int]  # group -> node id
    consumed: dict[str, str]  # group -> the consumer's last line
    leader: int | None = None  # the node leading the partition produced to
    alternating: int | None = None  # the node whose address alternates (if any)


def _topic(cluster: LocalCluster) -> tuple[str, int, int]:
    """A new topic, its partition 0 and the index of the mock broker leading it (the one
    relay for all leads to it: through that, the other leaders are out of reach)."""
    topic = f"plain-{uuid.uuid4().hex[:6]}"
    leader = cluster.partition_leaders(topic)[0]
    return topic, 0, next(i for i, b in enumerate(cluster.mock) if b.node_id == leader)


def _capture(
    cluster: LocalCluster,
    where: Path,
    topic: tuple[str, int, int],
    routes: dict[int, list[int]],
    groups_per_broker: dict[int, int],
    consume: bool = True,
) -> Plain:
    """Produce to the topic's partition, then one consumer per group at once (groups
    coordinated by the brokers of the given indexes), all on a laptop behind the relays."""
    name, partition, _leader = topic
    laptop = RelayedLaptop(cluster, routes, where)
    try:
        produced = laptop.run(*WORKLOAD, "produce", laptop.bootstrap, name, "20", str(partition))
        assert "PRODUCED 20" in produced.stdout, produced.stderr[-2000:]
        spread = cluster.groups_by_coordinator(max(groups_per_broker.values()), f"{name}-g")
        coordinators = {}
        for index, count in groups_per_broker.items():
            node = cluster.mock[index].node_id
            coordinators.update(dict.fromkeys(spread[node][:count], node))
        consumed: dict[str, str] = {}
        if consume:
            # A denied group's consumer tries for 15 s; the others are done within a few
            # seconds. The capture lasts as long as the longest.
            def run(group: str) -> str:
                out = laptop.run(*WORKLOAD, "consume", laptop.bootstrap, group, name, "20", "15")
                return out.stdout.strip()

            with ThreadPoolExecutor(len(coordinators)) as pool:
                consumed = dict(zip(coordinators, pool.map(run, coordinators), strict=True))
    finally:
        try:
            laptop.finish()
        finally:
            laptop.close()
    relays = {cluster.mock[i].node_id: f"{a}:{RELAY_PORT}" for i, a in laptop.relay_address.items()}
    return Plain(where, relays, coordinators, consumed)


@pytest.fixture(scope="module")
def captures(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Plain]]:
    where = tmp_path_factory.mktemp("plain")
    every = {0: 2, 1: 2, 2: 2}
    out = {}
    for name in ("healthy", "one-relay", "alternating", "producer-only"):
        # Which consumers meet the wrong broker through the alternating relay depends on
        # the order of every connection to it (librdkafka sends FindCoordinator to any
        # broker, so connections other than the coordinator's take turns too): captured
        # again, on a new topic, until some consumers met each broker (what the test needs)
        for attempt in range(4 if name == "alternating" else 1):
            topic = _topic(cluster)
            leader = topic[2]
            # the brokers that do not lead, the bootstrap broker last (an alternating relay
            # on its address would also take every client's first connection)
            others = sorted((i for i in range(3) if i != leader), key=lambda i: i == 0)
            routes, groups, consume = {
                "healthy": ({i: [i] for i in range(3)}, every, True),
                "one-relay": ({i: [leader] for i in range(3)}, every, True),
                # the address of a broker that neither leads nor bootstraps: to it, then
                # to the other
                "alternating": ({leader: [leader], others[0]: others, others[1]: [others[1]]},
                                {others[0]: 4}, True),
                "producer-only": ({i: [i] for i in range(3)}, {0: 1}, False),
            }[name]  # fmt: skip
            (where / name / str(attempt)).mkdir(parents=True)
            path = where / name / str(attempt) / f"{name}.pcap"
            plain = _capture(cluster, path, topic, routes, groups, consume)
            denied = {"NOT_COORDINATOR 0" not in line for line in plain.consumed.values()}
            if name != "alternating" or denied == {True, False}:
                break
        out[name] = plain
        plain.leader = cluster.mock[leader].node_id
        plain.alternating = cluster.mock[others[0]].node_id
    out["dns"] = _dns_capture(cluster, where / "dns.pcap")
    yield out


def _dns_capture(cluster: LocalCluster, where: Path) -> Plain:
    """tansu advertises its Kubernetes name; the laptop asks a DNS server (dnsmasq 2.90 on
    the relay host) and gets the relay's address, so the capture holds the answer."""
    assert cluster.tansu is not None
    laptop = RelayedLaptop(cluster, {}, where, dns=[TANSU_HOST])
    bootstrap = f"{TANSU_HOST}:{cluster.tansu.port}"
    try:
        topic = f"plain-dns-{uuid.uuid4().hex[:6]}"
        produced = laptop.run(*WORKLOAD, "produce", bootstrap, topic, "10")
        assert "PRODUCED 10" in produced.stdout, produced.stderr[-2000:]
        group = f"{topic}-g"
        consumed = laptop.run(*WORKLOAD, "consume", bootstrap, group, topic, "10", "20")
    finally:
        try:
            laptop.finish()
        finally:
            laptop.close()
    relay = f"{laptop.named[TANSU_HOST]}:{cluster.tansu.port}"
    return Plain(where, {TANSU_NODE: relay}, {group: TANSU_NODE}, {group: consumed.stdout})


def _verify(path: Path, *flags: str) -> tuple[int, dict[str, Any], str]:
    result = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--in-process", "--json", "-", *flags,
         str(path)], capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


def _verdicts(report: dict[str, Any]) -> dict[str, str]:
    return {g["key"]: g["verdict"] for g in report["groups"]}


def _why(report: dict[str, Any], plain: Plain) -> list[tuple[Any, ...]]:
    """Each group's verdict, verify's reasons, the end of its timeline and what its
    consumer saw: the evidence to read when a verdict is not the one expected."""
    return [(g["key"], g["verdict"], g["reasons"], g["timeline"][-4:],
             plain.consumed.get(g["key"], "")) for g in report["groups"]]  # fmt: skip


def _addresses(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["address"]: a for a in report["addresses"]}


def test_one_relay_per_broker_every_group_ok(captures: dict[str, Plain], tmp_path: Path) -> None:
    """No DNS, no recording: each relay address is identified by what it answered, and
    every group is ok, also with --strict. The terminal table, the JSON and the HTML show
    the address map, the files read and that no leak check was possible."""
    plain = captures["healthy"]
    assert all("CONSUMED 20" in line for line in plain.consumed.values()), plain.consumed
    page = tmp_path / "report.html"
    code, report, err = _verify(plain.path, "--strict", "--html", str(page))
    assert code == 0, (err[-2000:], _why(report, plain))
    text = page.read_text()
    for said in ("Brokers behind the captured addresses", "behaviour", str(plain.path),
                 "no leak check was possible", *plain.relays.values()):  # fmt: skip
        assert said in text, said
    terminal = " ".join(err.split())
    assert "brokers behind the captured addresses" in terminal
    assert "plain capture: no leak check was possible" in terminal
    assert _verdicts(report) == dict.fromkeys(plain.coordinators, "ok")
    found = _addresses(report)
    for node, relay in plain.relays.items():
        shown = (found[relay]["node"], found[relay]["method"])
        assert shown == (node, "behaviour"), (node, relay, found, _why(report, plain))
    assert report["sources"] == [str(plain.path)] and report["tunnel_recording"] is False


def test_one_relay_for_every_broker_misroutes_exactly_the_others(
    captures: dict[str, Plain],
) -> None:
    """The NOT_COORDINATOR failure: every advertised address leads to one broker. Exactly
    the groups other brokers coordinate are misrouted; the rest are ok."""
    plain = captures["one-relay"]
    target = plain.leader
    assert target is not None
    code, report, _ = _verify(plain.path)
    assert code == 1
    expected = {
        g: "ok" if node == target else "misrouted" for g, node in plain.coordinators.items()
    }
    assert _verdicts(report) == expected, _why(report, plain)
    found = _addresses(report)
    assert found[plain.relays[target]]["node"] == target
    for node, relay in plain.relays.items():  # the others say whom they are not
        if node != target:
            said = f"answered NOT_COORDINATOR for keys broker {node} coordinates"
            assert found[relay]["node"] is None and said in found[relay]["note"], found[relay]


def test_a_relay_to_two_brokers_is_ambiguous(
    captures: dict[str, Plain], cluster: LocalCluster
) -> None:
    """One relay takes each new connection to its broker, then another, then its broker...:
    its address is reported ambiguous, with when it changed, and each group is judged by the
    broker its own connection reached: the ones that met the wrong one are misrouted."""
    plain = captures["alternating"]
    node = plain.alternating
    assert node is not None
    code, report, err = _verify(plain.path)
    relay = _addresses(report)[plain.relays[node]]
    assert relay["ambiguous"] and len(relay["changes"]) >= 2, relay
    first = relay["changes"][0]
    who = "another broker" if first["node"] is None else f"broker {first['node']}"
    assert f"at {first['t_ms']} ms: {who}" in " ".join(err.split())
    assert "answers as broker" in relay["note"], relay
    verdicts = _verdicts(report)
    for group, line in plain.consumed.items():
        denied = "NOT_COORDINATOR 0" not in line  # what the consumer itself saw
        expected = "misrouted" if denied else "ok"
        assert verdicts[group] == expected, (group, line, _why(report, plain), relay)
    assert set(verdicts.values()) == {"ok", "misrouted"}, (verdicts, plain.consumed)
    assert code == 1


def test_dns_answers_in_the_capture_name_the_broker(captures: dict[str, Plain]) -> None:
    """The broker advertises a name; the capture holds the DNS answer that gave the laptop
    the relay's address for it: identified by DNS (stronger than behaviour, which agrees)."""
    plain = captures["dns"]
    assert all("CONSUMED 10" in line for line in plain.consumed.values()), plain.consumed
    code, report, _ = _verify(plain.path, "--strict")
    found = _addresses(report)[plain.relays[TANSU_NODE]]
    assert (found["node"], found["method"]) == (TANSU_NODE, "dns"), found
    assert found["evidence"].get("behaviour") and found["evidence"]["dns"] == 1
    assert code == 0 and _verdicts(report) == dict.fromkeys(plain.coordinators, "ok")


def test_nothing_checked_says_so_and_fails_strict(captures: dict[str, Plain]) -> None:
    """A producer and no group: nothing to judge (said, and --strict fails), yet the relay
    of the partition's leader is identified by what it did: it served the Produce requests
    for a partition the Metadata in force said it leads."""
    plain = captures["producer-only"]
    code, report, err = _verify(plain.path)
    assert code == 0 and "NOTHING CHECKED: no consumer group" in " ".join(err.split())
    assert "verify: passed, but NOTHING was checked" in " ".join(err.split())
    assert report["nothing_checked"]
    assert plain.leader is not None
    found = _addresses(report)[plain.relays[plain.leader]]
    assert (found["node"], found["method"]) == (plain.leader, "behaviour"), found
    assert found["behaviour"].get("leader") and "coordinator" not in found["behaviour"], found
    code, _, err = _verify(plain.path, "--strict")
    assert code == 1 and "strict: no consumer group" in " ".join(err.split())


def test_the_user_names_a_broker_and_wins(
    captures: dict[str, Plain], cluster: LocalCluster
) -> None:
    """--broker ADDRESS=NODE overrides what the traffic says (here, wrongly: so the groups
    whose coordinator sits there are judged misrouted)."""
    plain = captures["healthy"]
    first, second = cluster.mock[0].node_id, cluster.mock[1].node_id
    code, report, _ = _verify(plain.path, "--broker", f"{plain.relays[first]}={second}")
    found = _addresses(report)[plain.relays[first]]
    assert (found["node"], found["method"]) == (second, "user")
    for group, node in plain.coordinators.items():
        assert _verdicts(report)[group] == ("misrouted" if node == first else "ok")
    assert code == 1


def test_directories_are_read_recursively(captures: dict[str, Plain], tmp_path: Path) -> None:
    top = tmp_path / "ci"
    (top / "day-1" / "run-1").mkdir(parents=True)
    shutil.copy(captures["healthy"].path, top / "day-1" / "run-1" / "a.pcap")
    shutil.copy(captures["producer-only"].path, top / "b.pcap")
    _, report, _ = _verify(top)
    nested = top / "day-1" / "run-1" / "a.pcap"
    assert sorted(report["sources"]) == sorted([str(top / "b.pcap"), str(nested)])
    assert _verdicts(report) == dict.fromkeys(captures["healthy"].coordinators, "ok")


def test_spark_and_the_single_process_agree(captures: dict[str, Plain], spark: Any) -> None:
    for plain in captures.values():
        local = verify_local([str(plain.path)])
        remote = verify_spark([str(plain.path)], spark)
        assert sorted((v.key, v.verdict) for v in local.verdicts) == sorted(
            (v.key, v.verdict) for v in remote.verdicts
        )
        assert local.addresses == remote.addresses


def test_a_file_cut_short_is_named_with_its_offset(
    captures: dict[str, Plain], tmp_path: Path
) -> None:
    """tcpdump's pcap and kafkatunnel's pcapng, each cut inside a packet's header or its
    data, two thirds in (a copy made while still being written): what precedes is judged, the
    file is reported with the byte where the cut packet starts, and --strict fails the run."""
    from tests.verify.conftest import ROUTED

    for original in (captures["healthy"].path, sorted(ROUTED.iterdir())[0]):
        data = original.read_bytes()
        start, length = next((s, n) for s, n in _packets(data) if s >= len(data) * 2 // 3)
        for inside in (7, length // 2):  # in the record or block header; in its data
            cut = tmp_path / f"cut-{inside}-{original.name}"
            cut.write_bytes(data[: start + inside])
            code, report, err = _verify(cut)
            assert code == 0 and report["groups"], report
            assert report["cut_short"] == [f"{cut} at byte {start}"], report["cut_short"]
            assert any(f"cut short at byte {start}" in p for p in report["problems"])
            code, _, err = _verify(cut, "--strict")
            said = " ".join(err.split())
            assert code == 1 and f"strict: cut short: {cut} at byte {start}" in said, said


def test_a_segment_missing_from_the_capture_is_named(
    captures: dict[str, Plain], tmp_path: Path
) -> None:
    """A capture that dropped a packet (tcpdump's "packets dropped by kernel"): the rest of
    that direction of the connection cannot be read, and verify names the connection, the
    side and the fix instead of leaving its groups unverified without a word."""
    data = captures["healthy"].path.read_bytes()
    segments = [s for s in _tcp_segments(data) if s[4]]  # those that carry bytes
    # a broker's answer with more of the same direction after it
    start, length, (client, server) = next(
        (s[0], s[1], (s[3], s[2])) for i, s in enumerate(segments)
        if s[2].endswith(f":{RELAY_PORT}") and s[2:4] in (later[2:4] for later in segments[i + 1:])
    )  # fmt: skip
    lossy = tmp_path / "lossy.pcap"
    lossy.write_bytes(data[:start] + data[start + length :])
    _, report, err = _verify(lossy)
    said = [p for p in report["problems"] if p.startswith(f"{lossy}/{client}/{server}: ")]
    assert len(said) == 1 and "a segment from the server was not captured" in said[0], said
    assert "tcpdump -B" in said[0] and f"{client}/{server}" in " ".join(err.split())


def _tcp_segments(data: bytes) -> Iterator[tuple[int, int, str, str, int]]:
    """(offset, length, source, destination, payload bytes) of each TCP segment of a pcap
    of Ethernet frames carrying IPv4, read here independently of the reader under test."""
    for start, length in _packets(data):
        frame = data[start + 16 : start + length]
        if frame[12:14] != b"\x08\x00" or frame[23] != 6:  # IPv4, TCP
            continue
        ip = frame[14:]
        header, total = (ip[0] & 0x0F) * 4, int.from_bytes(ip[2:4], "big")
        tcp = ip[header:]
        ports = struct.unpack_from(">HH", tcp)
        source = f"{'.'.join(map(str, ip[12:16]))}:{ports[0]}"
        destination = f"{'.'.join(map(str, ip[16:20]))}:{ports[1]}"
        yield start, length, source, destination, total - header - (tcp[12] >> 4) * 4


def _packets(data: bytes) -> Iterator[tuple[int, int]]:
    """(offset, length) of each pcap record or pcapng block, read here independently of the
    reader under test (pcap: 24-byte file header, 16-byte record headers with the captured
    length at 8; pcapng: each block's total length at 4, in the section's byte order)."""
    if data[:4] == b"\x0a\x0d\x0d\x0a":
        order = "<" if data[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
        pos = 0
        while pos + 8 <= len(data):
            (length,) = struct.unpack_from(order + "I", data, pos + 4)
            yield pos, length
            pos += length
        return
    order = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    pos = 24
    while pos + 16 <= len(data):
        (captured,) = struct.unpack_from(order + "I", data, pos + 8)
        yield pos, 16 + captured
        pos += 16 + captured
