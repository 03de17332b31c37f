"""What each test costs: wall time against the CPU time its own processes used (this
process's and its reaped children's), one JSON line per test into $KT_TEST_COSTS.
`KT_TEST_COSTS=FILE python -m pytest -p tests.costs`. A test whose CPU is far below its
wall time is waiting: on a start-up, a deadline, a peer. Processes a test leaves to others
to reap (a JVM pyspark starts, a daemon) are not counted."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator

import pytest


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    where = os.environ.get("KT_TEST_COSTS")
    if not where:
        return (yield)
    wall, cpu = time.monotonic(), _cpu()
    try:
        return (yield)
    finally:
        line = {"test": item.nodeid, "wall": round(time.monotonic() - wall, 3),
                "cpu": round(_cpu() - cpu, 3),
                "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}  # fmt: skip
        with open(where, "a") as costs:
            costs.write(json.dumps(line) + "\n")
