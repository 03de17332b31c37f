"""Real client workloads for the demo, the benchmarks and the tests: a producer and
consumer groups (confluent-kafka / librdkafka), each reporting exactly what it saw.

A consumer group's failure to reach its coordinator does not reach `poll()`: librdkafka
retries it internally and only logs it. So each consumer also reads librdkafka's group log
and counts the coordinator errors the broker answered with.

Also runnable as `python -m kafkatunnel.demo.workload produce BOOTSTRAP TOPIC COUNT`,
e.g. inside the cluster's network namespace, printing `PRODUCED n`.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka

# A final commit refused because the member is no longer the group's: an application
# stopped while its group rebalanced (a forward killed under it); what it processed since
# its last commit is delivered again when the group resumes.
FENCED = frozenset({
    confluent_kafka.KafkaError.UNKNOWN_MEMBER_ID,
    confluent_kafka.KafkaError.ILLEGAL_GENERATION,
    confluent_kafka.KafkaError.REBALANCE_IN_PROGRESS,
})  # fmt: skip
MOVING = frozenset(
    {
        confluent_kafka.KafkaError.NOT_COORDINATOR,
        confluent_kafka.KafkaError.COORDINATOR_NOT_AVAILABLE,
        confluent_kafka.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)  # fmt: skip  (retriable: the group's coordinator moved, or is loading it)
COMMIT_TIMEOUT = 30.0  # how long a final commit is tried again while its coordinator moves
COORDINATOR_ERRORS = re.compile(
    r"Not coordinator|NOT_COORDINATOR|Coordinator not available|COORDINATOR_NOT_AVAILABLE|"
    r"Coordinator load in progress|COORDINATOR_LOAD_IN_PROGRESS"
)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _logger(name: str) -> tuple[logging.Logger, _Collect]:
    collect = _Collect()
    logger = logging.getLogger(f"kafkatunnel.demo.workload.{name}")
    logger.handlers = [collect]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return logger, collect


@dataclass
class GroupResult:
    group: str
    expected: int
    consumed: int = 0
    values: list[bytes] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # errors the client reported
    coordinator_errors: list[str] = field(default_factory=list)  # from librdkafka's group log
    redelivered: int = 0  # records seen again after a rejoin (skipped with dedupe_by_offset)
    processed: set[tuple[int, int]] = field(default_factory=set)  # (partition, offset), deduped

    @property
    def not_coordinator(self) -> int:
        return sum(1 for e in self.coordinator_errors if "ot coordinator" in e or "NOT_COORD" in e)

    @property
    def ok(self) -> bool:
        return self.consumed == self.expected and not self.coordinator_errors


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    prefix: str = "m",
    partition: int | None = None,
    config: dict[str, Any] | None = None,
    timeout: float = 30.0,
) -> int:
    """Produce `count` messages `prefix-0`... (to one partition if given); returns how many
    the brokers acknowledged."""
    delivered = 0

    def on_delivery(error: Any, _message: Any) -> None:
        nonlocal delivered
        if error is None:
            delivered += 1

    logger, _ = _logger(f"producer-{topic}")
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "logger": logger, "linger.ms": 5, **(config or {})}
    )
    for index in range(count):
        value = f"{prefix}-{index}".encode()
        if partition is None:
            producer.produce(topic, value, on_delivery=on_delivery)
        else:
            producer.produce(topic, value, partition=partition, on_delivery=on_delivery)
        producer.poll(0)
    producer.flush(timeout)
    return delivered


def produce_transaction(
    bootstrap: str, topic: str, transactional_id: str, count: int, timeout: float = 30.0
) -> None:
    """One committed transaction of `count` messages `<transactional_id>-0`..."""
    logger, _ = _logger(f"producer-{transactional_id}")
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "logger": logger}
    )
    producer.init_transactions(timeout)
    producer.begin_transaction()
    for index in range(count):
        producer.produce(topic, f"{transactional_id}-{index}".encode())
    producer.commit_transaction(timeout)


def consume_group(
    bootstrap: str,
    group: str,
    topic: str,
    expected: int,
    *,
    timeout: float = 30.0,
    config: dict[str, Any] | None = None,
    stop_after_coordinator_errors: int | None = None,
    dedupe_by_offset: bool = False,
    stop: threading.Event | None = None,
    processed_before: set[tuple[int, int]] | None = None,
) -> GroupResult:
    """Consume `topic` from the start as `group` until `expected` messages, the deadline or
    `stop`, committing offsets; report what was consumed and every coordinator error seen.

    With `dedupe_by_offset`, a record at a (partition, offset) already processed is skipped
    and counted as redelivered: Kafka redelivers from the last committed offset after a
    group rejoins, and this is how an application processes each record exactly once.
    `processed_before` continues an earlier run of the same application (its `processed`):
    what that run processed after its last commit that landed is delivered again here.

    With `stop_after_coordinator_errors`, give up as soon as that many coordinator errors
    were logged (a group that cannot reach its coordinator never recovers on its own).
    """
    logger, log = _logger(f"consumer-{group}")
    result = GroupResult(group, expected)
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": True,
        "logger": logger,
        "debug": "cgrp",
        "error_cb": lambda error: result.errors.append(str(error)),
        **(config or {}),
    }
    if settings.get("group.protocol") != "consumer":  # KIP-848's timeouts are the broker's
        # Short-lived consumers: a member that left without a clean LeaveGroup holds a
        # rebalance for the session timeout, so keep it at the brokers' minimum.
        settings = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, **settings}
    consumer = confluent_kafka.Consumer(settings)
    processed = result.processed
    processed.update(processed_before or ())
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while result.consumed < expected and time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                break
            if stop_after_coordinator_errors is not None:
                seen = sum(1 for line in log.lines if COORDINATOR_ERRORS.search(line))
                if seen >= stop_after_coordinator_errors:
                    break
            message = consumer.poll(0.1)
            if message is None:
                continue
            if message.error():
                result.errors.append(str(message.error()))
                continue
            if dedupe_by_offset:
                position = (message.partition() or 0, message.offset() or 0)
                if position in processed:
                    result.redelivered += 1
                    continue
                processed.add(position)
            result.consumed += 1
            result.values.append(message.value() or b"")
        commit_by = time.monotonic() + COMMIT_TIMEOUT
        while result.consumed:
            try:
                consumer.commit(asynchronous=False)
            except confluent_kafka.KafkaException as error:
                code = error.args[0].code()
                if code in MOVING and time.monotonic() < commit_by:
                    time.sleep(0.1)  # its coordinator moved or is loading: again, as apps do
                    continue
                if code in FENCED:  # stopped while its group rebalanced: redelivered later
                    result.errors.append(str(error.args[0]))
                elif code != confluent_kafka.KafkaError._NO_OFFSET:
                    raise  # _NO_OFFSET: the auto-commit already stored everything
            break
    finally:
        consumer.close()
    result.coordinator_errors = [line for line in log.lines if COORDINATOR_ERRORS.search(line)]
    return result


def consume_groups(
    bootstrap: str,
    groups: dict[str, int],
    topic: str,
    *,
    timeout: float = 30.0,
    stop_after_coordinator_errors: int | None = None,
    dedupe_by_offset: bool = False,
    stop: threading.Event | None = None,
) -> dict[str, GroupResult]:
    """Run one consumer per group (group -> expected count) at the same time, as separate
    applications would; each result as `consume_group` gives it."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(len(groups), 1)) as pool:
        futures = {
            group: pool.submit(
                consume_group,
                bootstrap,
                group,
                topic,
                expected,
                timeout=timeout,
                stop_after_coordinator_errors=stop_after_coordinator_errors,
                dedupe_by_offset=dedupe_by_offset,
                stop=stop,
            )
            for group, expected in groups.items()
        }
        return {group: future.result() for group, future in futures.items()}


USAGE = """usage: python -m kafkatunnel.demo.workload produce BOOTSTRAP TOPIC COUNT [N]
       python -m kafkatunnel.demo.workload consume BOOTSTRAP GROUP TOPIC COUNT [SECONDS]
       python -m kafkatunnel.demo.workload transact BOOTSTRAP TOPIC ID COUNT [SECONDS]
N: the partition to produce to; SECONDS: how long to wait for COUNT messages (60), or for
the transaction of COUNT messages as transactional id ID to commit (30).
Extra client settings (e.g. TLS) as JSON in KAFKATUNNEL_CLIENT_CONFIG."""


def main(argv: list[str]) -> int:
    import json
    import os

    config = json.loads(os.environ.get("KAFKATUNNEL_CLIENT_CONFIG", "{}"))
    if len(argv) in (4, 5) and argv[0] == "produce" and all(a.isdigit() for a in argv[3:]):
        bootstrap, topic, count = argv[1], argv[2], int(argv[3])
        partition = int(argv[4]) if len(argv) == 5 else None
        done = produce(bootstrap, topic, count, partition=partition, config=config)
        print(f"PRODUCED {done}", flush=True)
        return 0
    if len(argv) in (5, 6) and argv[0] == "consume" and all(a.isdigit() for a in argv[4:]):
        timeout = float(argv[5]) if len(argv) == 6 else 60.0
        result = consume_group(argv[1], argv[2], argv[3], int(argv[4]), timeout=timeout,
                               config=config)  # fmt: skip
        print(f"CONSUMED {result.consumed} NOT_COORDINATOR {result.not_coordinator}", flush=True)
        return 0 if result.consumed == int(argv[4]) else 1
    if len(argv) in (5, 6) and argv[0] == "transact" and all(a.isdigit() for a in argv[4:]):
        timeout = float(argv[5]) if len(argv) == 6 else 30.0
        try:
            produce_transaction(argv[1], argv[2], argv[3], int(argv[4]), timeout=timeout)
        except confluent_kafka.KafkaException as error:
            print(f"FAILED {error}", flush=True)
            return 1
        print(f"COMMITTED {argv[4]}", flush=True)
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
