"""Make tests/data/recordings/group-kinds, the recording CI verifies for every kind of group
Kafka 4 has: `up --record` in front of Apache Kafka (tests/worlds/apache.py,
the reference version) while a group of each kind and a transactional id do their work.

    python scripts/record_group_kinds.py [OUT_DIR]   (as root: the cluster runs in a
                                                      network namespace of its own)

- a classic and a consumer group (KIP-848), confluent-kafka, reading 10 records;
- a share group (KIP-932), the Java client's KafkaShareConsumer, reading and acknowledging
  them;
- a streams group (KIP-1071), the tests' Kafka Streams application (StreamsCounter, exactly
  once, with a repartition and a state store), counting 30 orders: its transactional ids
  too;
- a transactional id of confluent-kafka's, committing 3 records.

Everything verifies ok (`kafkatunnel verify --strict`), each group with its type.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from kafkatunnel.demo.workload import consume_group, produce, produce_transaction
from tests.apache.conftest import CLIENTS
from tests.apache.test_apache_kafka import tunnel
from tests.apache.test_groups import consumed, share_consumer, share_from_earliest
from tests.apache.test_streams import (
    TASKS,
    Counts,
    Instance,
    Orders,
    streams_lib,
    topics,
    until_running,
)
from tests.worlds.apache import ApacheKafka

RECORDS, ORDERS = 10, 30


def compiled(work: Path, lib: Path, source: str) -> str:
    out = work / source.removesuffix(".java")
    out.mkdir()
    subprocess.run(["javac", "-cp", f"{lib}/*", "-d", str(out), str(CLIENTS / source)],
                   check=True, timeout=300)  # fmt: skip
    return f"{lib}/*:{out}"


def main(out: Path) -> int:
    target = out / "group-kinds"
    shutil.rmtree(target, ignore_errors=True)
    name = f"kinds-{uuid.uuid4().hex[:4]}"
    groups = {kind: f"{name}-{kind}" for kind in ("classic", "consumer", "share", "streams")}
    with tempfile.TemporaryDirectory() as scratch, ApacheKafka() as kafka:
        work = Path(scratch)
        java = compiled(work, kafka.lib, "JavaClient.java")
        streams = compiled(work, streams_lib(), "StreamsCounter.java")
        share_from_earliest(kafka, [groups["share"]])
        with tunnel(kafka, "plain", "--record", str(target)) as bootstrap:
            topic = f"{name}-records"
            assert produce(bootstrap, topic, RECORDS) == RECORDS
            for kind in ("classic", "consumer"):
                result = consume_group(bootstrap, groups[kind], topic, RECORDS, timeout=60,
                                       config={"group.protocol": kind})  # fmt: skip
                assert len(set(result.values)) == RECORDS, (kind, result.errors)
            argv = share_consumer(java, bootstrap, topic, groups["share"], RECORDS, 60)
            assert consumed(subprocess.run(argv, capture_output=True, text=True)) == RECORDS

            app = groups["streams"]
            topics(bootstrap, f"{app}-orders", f"{app}-counts")
            orders = Orders(bootstrap, f"{app}-orders")
            orders.produce(ORDERS)
            instance = Instance(streams, app, bootstrap, app, orders.topic, f"{app}-counts",
                                "streams", str(work / app))  # fmt: skip
            try:
                until_running([instance], lambda tasks: tasks == [TASKS], "Streams to run")
                reader = Counts(bootstrap, f"{app}-counts")
                reader.reach(ORDERS)
            finally:
                instance.stop()
            assert reader.to_the_end() == dict(orders.acknowledged)  # and commits, closes
            orders.producer.flush(10)
            produce_transaction(bootstrap, topic, f"{name}-txn", 3, timeout=60)
    print(groups)
    for path in sorted(target.rglob("*.pcap*")):
        print(path, path.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tests/data/recordings")))
