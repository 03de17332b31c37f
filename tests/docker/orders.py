"""The application in the container, as a developer's would be: it takes the brokers from
KAFKA_BOOTSTRAP_SERVERS, as the recipes of docs/containers.md set it, produces to a topic and
consumes it once with each group named, printing for each what it consumed and how many
NOT_COORDINATOR errors it met.

    python tests/docker/orders.py TOPIC COUNT GROUP...
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

from kafkatunnel.demo.workload import consume_group, produce


def main(topic: str, count: str, *groups: str) -> int:
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    print(f"PRODUCED {produce(bootstrap, topic, int(count))}", flush=True)
    with ThreadPoolExecutor(len(groups) or 1) as pool:  # as an application's consumers run
        results = pool.map(lambda g: consume_group(bootstrap, g, topic, int(count), timeout=60),
                           groups)  # fmt: skip
        for group, result in zip(groups, results, strict=True):
            print(f"CONSUMED {group} {result.consumed} NOT_COORDINATOR {result.not_coordinator}",
                  flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
