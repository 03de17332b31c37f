"""The workload's exactly-once processing carries across two runs of one application: what
an earlier run processed is skipped when its group delivers it again (the fault tests'
groups stop under faults and finish from their commits)."""

from __future__ import annotations

import uuid

from kafkatunnel.demo.workload import consume_group, produce
from tests.tunnel.conftest import MakeTunnel


def test_a_later_run_skips_what_an_earlier_run_processed(make_tunnel: MakeTunnel) -> None:
    tunnel = make_tunnel()
    topic = f"dedupe-{uuid.uuid4().hex[:8]}"
    assert produce(tunnel.bootstrap_servers, topic, 10, partition=0) == 10
    earlier = consume_group(tunnel.bootstrap_servers, f"{topic}-a", topic, 10, timeout=60,
                            dedupe_by_offset=True)  # fmt: skip
    assert earlier.values == [f"m-{i}".encode() for i in range(10)]
    first_four = {position for position in earlier.processed if position[1] < 4}
    assert len(first_four) == 4, earlier.processed  # one partition, offsets 0..9

    # a group with no commit is delivered everything from the start, as after a lost commit
    later = consume_group(tunnel.bootstrap_servers, f"{topic}-b", topic, 6, timeout=60,
                          dedupe_by_offset=True, processed_before=first_four)  # fmt: skip
    assert later.values == [f"m-{i}".encode() for i in range(4, 10)]
    assert later.redelivered == 4
    assert first_four < later.processed
