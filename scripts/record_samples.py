"""Make the small recordings under tests/data/recordings that CI verifies.

    python scripts/record_samples.py [OUT_DIR]   (as root: the single-forward control
                                                   needs network isolation)

- routed/: `up --record` of a session through the tunnel: 6 consumer groups whose
  coordinators cover all three brokers, an idempotent producer, and 3 transactional ids, one
  per coordinator. Rotated every 48 KiB, so some calls cross files. Verifies ok.
- single-forward.pcapng: dumpcap on loopback while the same groups use one forward for
  every broker address (the NOT_COORDINATOR failure). Verifies misrouted.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path

from kafkatunnel.demo import LocalCluster
from tests.worlds.sessions import (
    capture_single_forward,
    record_routed_session,
    spread_workload,
)


def main(out: Path) -> int:
    shutil.rmtree(out / "routed", ignore_errors=True)
    with LocalCluster() as cluster:
        if not cluster.isolated:
            print("needs root: the single-forward control runs in a network namespace")
            return 2
        work = spread_workload(cluster, f"sample-{uuid.uuid4().hex[:4]}")
        cluster.produce_inside(work.topic, work.messages, partition=0)
        control = capture_single_forward(cluster, work, out / "single-forward.pcapng")
        results = record_routed_session(
            cluster, work, out / "routed", already=work.messages, rotate_bytes=48 * 1024,
            committed={group: result.consumed for group, result in control.items()},
        )  # fmt: skip
        print({group: result.consumed for group, result in results.items()})
    for path in sorted(out.rglob("*.pcap*")):
        print(path, path.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tests/data/recordings")))
