"""The "deployed" application of the `up --isolate` tests: run inside the cluster's network,
straight to the brokers (not through the tunnel), as the copy running in Kubernetes is, and
saying on standard output everything that happens to it.

  consume BOOTSTRAP GROUP TOPIC PROTOCOL
      a consumer of GROUP (group.protocol PROTOCOL: classic or consumer) that never commits:
      ASSIGNED <partitions> MEMBER <id> and REVOKED <partitions> at every change of its
      assignment, CONSUMED <n> after each record
  transact BOOTSTRAP TOPIC TRANSACTIONAL_ID
      a transactional producer committing a transaction of one record every 0.2 s:
      COMMITTED <n> after each; FENCED <error> and exit 3 when another producer took its id
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

import confluent_kafka

PAUSE = 0.2


def _partitions(partitions: list[Any]) -> str:
    return ",".join(str(p.partition) for p in sorted(partitions, key=lambda p: p.partition))


def consume(bootstrap: str, group: str, topic: str, protocol: str) -> int:
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": protocol,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    if protocol == "classic":
        settings |= {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
    consumer = confluent_kafka.Consumer(settings)

    def assigned(member: Any, partitions: list[Any]) -> None:
        if partitions or protocol == "classic":
            print(f"ASSIGNED {_partitions(partitions)} MEMBER {member.memberid()}", flush=True)

    def revoked(_member: Any, partitions: list[Any]) -> None:
        print(f"REVOKED {_partitions(partitions)}", flush=True)

    consumer.subscribe([topic], on_assign=assigned, on_revoke=revoked)
    consumed = 0
    try:
        while True:
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            consumed += 1
            print(f"CONSUMED {consumed}", flush=True)
    finally:
        consumer.close()


def transact(bootstrap: str, topic: str, transactional_id: str) -> int:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id}
    )
    producer.init_transactions(60)
    committed = 0
    while True:
        try:
            producer.begin_transaction()
            producer.produce(topic, f"{transactional_id}-{committed}".encode())
            producer.commit_transaction(30)
        except confluent_kafka.KafkaException as raised:
            error = raised.args[0]
            if error.fatal():
                print(f"FENCED {error}", flush=True)
                return 3
            print(f"RETRY {error}", flush=True)
            if error.txn_requires_abort():
                producer.abort_transaction(30)
            continue
        committed += 1
        print(f"COMMITTED {committed}", flush=True)
        time.sleep(PAUSE)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if len(argv) == 5 and argv[0] == "consume":
        return consume(*argv[1:])
    if len(argv) == 4 and argv[0] == "transact":
        return transact(*argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
