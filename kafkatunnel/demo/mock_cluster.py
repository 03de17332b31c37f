"""Child process: a librdkafka mock cluster (real Kafka protocol over real TCP, real group
coordinators), kept alive until its standard input closes.

Run as `python -m kafkatunnel.demo.mock_cluster BROKERS`; it prints
`BROKERS id=host:port,...` once the cluster answers Metadata.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import confluent_kafka


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    silent = logging.getLogger("kafkatunnel.mock")
    silent.addHandler(logging.NullHandler())
    silent.propagate = False
    holder = confluent_kafka.Producer(
        {"test.mock.num.brokers": count, "logger": silent, "client.id": "mock-cluster-holder"}
    )
    brokers = holder.list_topics(timeout=10).brokers
    listing = ",".join(f"{b.id}={b.host}:{b.port}" for b in sorted(brokers.values(), key=_id))
    print(f"BROKERS {listing}", flush=True)
    sys.stdin.read()  # returns at EOF: the harness closed our stdin or died


def _id(broker: Any) -> int:
    return int(broker.id)


if __name__ == "__main__":
    main()
