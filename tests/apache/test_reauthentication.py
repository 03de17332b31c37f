"""The tunnel logs in again on the same connection when the broker's session ends (KIP-368),
on Apache Kafka's `reauth` listener (SCRAM-SHA-512 over TLS, as Strimzi's `scram-sha-512`
listener), whose sessions last REAUTH_MS: a broker closes a
connection whose session ran out on its next request, so a connection that carries a
client's traffic for several lifetimes, unclosed, was logged in again each time."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka

from kafkatunnel.waiting import wait_for
from tests.apache.test_apache_kafka import tls_flags
from tests.apache.test_login import login_flags, secret_file, status, up
from tests.worlds.apache import REAUTH_MS, SCRAM_PASSWORD, ApacheKafka

SESSIONS = 3  # session ends each connection lives through
PACE = 0.05  # seconds between two messages


def client_stats(into: dict[str, Any]) -> Any:
    """A librdkafka stats_cb keeping its latest statistics in `into`, and under "emitted" how
    many it gave."""

    def keep(text: str) -> None:
        into.update(json.loads(text))
        into["emitted"] = into.get("emitted", 0) + 1

    return keep


def connections_to_brokers(stats: dict[str, Any]) -> dict[str, tuple[str, int, int]]:
    """(state, connects, disconnects) of each of a client's connections to a broker or a
    coordinator (the bootstrap entries, which it may stop using, left out).

    `connects` counts connect attempts, and the logical coordinator broker also makes one
    each second it waits for an address, and one more when its coordinator is set again while
    it connects (`rd_kafka_broker_connect`, `rd_kafka_cgrp_coord_update` in librdkafka
    2.16): so a count is compared with the same client's before, not with 1."""
    return {name: (broker["state"], broker["connects"], broker["disconnects"])
            for name, broker in stats.get("brokers", {}).items()
            if not name.endswith("/bootstrap")}  # fmt: skip


def connected(stats: dict[str, Any], brokers: int) -> bool:
    """The client is connected to every broker (librdkafka opens connections only as it
    needs them)."""
    nodes = [b for b in stats.get("brokers", {}).values() if b.get("nodeid", -1) >= 0]
    return len(nodes) == brokers and all(b["state"] == "UP" for b in nodes)


def test_a_consumer_and_a_producer_live_through_several_session_ends_unclosed(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    """A consumer in a group and an idempotent producer, neither with any security setting,
    through `up --tls` logging in with SCRAM-SHA-512: for SESSIONS session lifetimes and more the
    producer produces and the consumer reads. Every message produced is read, once; neither
    client's connections to the brokers were closed or opened meanwhile (librdkafka's own
    counts, and the tunnel's); status counts the logins done again."""
    topic = f"reauth-{uuid.uuid4().hex[:6]}"
    flags = [*tls_flags(apache_kafka),
             *login_flags("SCRAM-SHA-512", secret_file(tmp_path, SCRAM_PASSWORD))]  # fmt: skip
    consumer_stats: dict[str, Any] = {}
    producer_stats: dict[str, Any] = {}
    with up(apache_kafka, "reauth", *flags) as (bootstrap, _process):
        producer = confluent_kafka.Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0,
            "statistics.interval.ms": 500, "stats_cb": client_stats(producer_stats)})  # fmt: skip
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"{topic}-g",
            "auto.offset.reset": "earliest", "statistics.interval.ms": 500,
            "stats_cb": client_stats(consumer_stats)})  # fmt: skip
        sent: list[str] = []
        read: list[str] = []
        acknowledged: list[bool] = []

        def read_one() -> bool:
            """Read for PACE seconds at most; True once every message sent was read."""
            message = consumer.poll(PACE)
            if message is not None and message.error() is None:
                read.append(bytes(message.value() or b"").decode())
            return len(read) >= len(sent)

        def step() -> None:
            value = f"m-{len(sent)}"
            producer.produce(topic, value.encode(),
                             on_delivery=lambda e, _m: acknowledged.append(e is None))  # fmt: skip
            sent.append(value)
            producer.poll(0)
            read_one()

        try:
            consumer.subscribe([topic])

            def under_way() -> bool:
                step()
                return bool(read) and all(connected(stats, 3) for stats in
                                          (consumer_stats, producer_stats))  # fmt: skip

            wait_for(under_way, timeout=60, what="the consumer reading, and both clients "
                     "connected to every broker")  # fmt: skip
            given = [stats.get("emitted", 0) for stats in (consumer_stats, producer_stats)]

            def counted_since() -> bool:  # statistics taken after both were connected
                step()
                return all(stats.get("emitted", 0) >= mark + 2 for stats, mark in
                           zip((consumer_stats, producer_stats), given, strict=True))  # fmt: skip

            wait_for(counted_since, timeout=30, what="both clients' next statistics")
            before = {name: connections_to_brokers(stats) for name, stats in
                      (("consumer", consumer_stats), ("producer", producer_stats))}  # fmt: skip
            opened = {e["tunnel"]: e["total_connections"] for e in status(bootstrap)[0]
                      ["endpoints"]}  # fmt: skip
            started = time.monotonic()
            while time.monotonic() - started < (SESSIONS + 0.5) * REAUTH_MS / 1000:
                step()
            producer.flush(30)
            wait_for(read_one, timeout=60, what="the consumer to read every message")
            producer.poll(1)  # the last statistics
            consumer.poll(1)
            after, shown = status(bootstrap)
        finally:
            consumer.close()
            producer.flush(5)
    assert acknowledged.count(True) == len(sent), "a message was not acknowledged"
    assert sorted(read) == sorted(sent)  # nothing lost, nothing twice
    for name, stats in (("consumer", consumer_stats), ("producer", producer_stats)):
        counts = connections_to_brokers(stats)
        assert counts == before[name], (name, before[name], counts)
        assert all(state == "UP" for state, _, _ in counts.values()), (name, counts)
    closed = {e["tunnel"]: (opened.get(e["tunnel"]), e["total_connections"])
              for e in after["endpoints"]
              if opened.get(e["tunnel"]) != e["total_connections"]}  # fmt: skip
    assert closed == {}, f"connections opened during the consume: {closed}"
    renewed = [e["login"]["reauthentications"] for e in after["endpoints"]
               if e["connections"]]  # fmt: skip
    assert renewed and all(n >= SESSIONS for n in renewed), renewed
    # as a person sees it (read a moment after the JSON: sessions are renewed meanwhile)
    shown_renewed = [int(n) for n in re.findall(r"as alice \(SCRAM-SHA-512; sessions renewed "
                                                r"(\d+)x\)", shown)]  # fmt: skip
    assert len(shown_renewed) >= len(renewed), shown
    assert all(n >= SESSIONS for n in shown_renewed), shown
    assert {e["login"]["session_lifetime_ms"] for e in after["endpoints"] if e["connections"]} \
        == {REAUTH_MS}  # fmt: skip
