"""FailureLog, the log of client connections' failures on a real event loop: what counts
as the same failure, the count said when a window ends with no new failure (its timer),
and the counts not said yet when the tunnel stops. (The judge itself: tests/test_ratelimit.py;
a flood through the tunnel: tests/tunnel/test_faults.py.)"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable

import pytest

from kafkatunnel.tunnel.failure_log import FailureLog

pytestmark = pytest.mark.quick

WINDOW = 2.0  # waited out by the tests that end a window: long beside a stalled CPU


async def _until(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.01)


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kafkatunnel.proxy"]


def test_clients_at_other_addresses_failing_alike_are_one_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client's address is no part of the cause, even where it is no number (IPv6)."""
    peers = [f"[fd00::{i:x}a]:{40000 + i}" for i in range(20)]

    async def run() -> None:
        failures = FailureLog(WINDOW)
        for peer in peers:
            failures.warn("127.0.0.1:9092", f"client {peer}: TLS: wrong version number", peer)
        await _until(lambda: len(_said(caplog)) == 2)
        failures.close()

    with caplog.at_level(logging.WARNING, logger="kafkatunnel.proxy"):
        asyncio.run(run())
    assert _said(caplog) == [
        f"127.0.0.1:9092: client {peers[0]}: TLS: wrong version number",
        f"127.0.0.1:9092: 19 more connections failed the same way in the last {WINDOW:g} s: "
        f"client {peers[0]}: TLS: wrong version number",
    ]


def test_numbers_do_not_make_a_failure_another_words_and_listeners_do(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A forward command's last line of stderr holds its pid and the time: the same failure
    for every connection. Other words, or another listener, are another failure."""
    refused = "upstream kafka-0:9092: `socat` exited with 1: 18:20:{:02d} socat[{}] E refused"

    async def run() -> None:
        failures = FailureLog(WINDOW)
        for i in range(5):
            failures.warn("127.0.0.1:9093", refused.format(i, 3000 + i), "127.0.0.1:1")
        failures.warn("127.0.0.1:9093", "upstream kafka-0:9092: timed out", "127.0.0.1:1")
        failures.warn("127.0.0.1:9094", refused.format(9, 4000), "127.0.0.1:1")
        await _until(lambda: any("more connection" in s for s in _said(caplog)))
        failures.close()

    with caplog.at_level(logging.WARNING, logger="kafkatunnel.proxy"):
        asyncio.run(run())
    assert _said(caplog) == [
        f"127.0.0.1:9093: {refused.format(0, 3000)}",
        "127.0.0.1:9093: upstream kafka-0:9092: timed out",
        f"127.0.0.1:9094: {refused.format(9, 4000)}",
        f"127.0.0.1:9093: 4 more connections failed the same way in the last {WINDOW:g} s: "
        f"{refused.format(0, 3000)}",
    ]


def test_a_stop_says_the_counts_not_said_yet(caplog: pytest.LogCaptureFixture) -> None:
    """The tunnel stops within the window: the count is said, over the time it covers, in
    the words of what the connections did (a client's own login is no failure)."""
    told = "client 127.0.0.1:{}: sent a SASL login of its own, which the tunnel answered"

    async def run() -> None:
        failures = FailureLog(30.0)
        for port in (5001, 5002, 5003):
            failures.warn("127.0.0.1:9092", told.format(port), f"127.0.0.1:{port}", "did so")
        failures.close()

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="kafkatunnel.proxy"):
        asyncio.run(run())
    took = time.monotonic() - started
    said = _said(caplog)
    assert said[0] == f"127.0.0.1:9092: {told.format(5001)}"
    counted = re.fullmatch(r"127\.0\.0\.1:9092: 2 more connections did so in the last "
                           r"([\d.]+) s: (.*)", said[1])  # fmt: skip
    assert counted is not None, said[1]
    assert float(counted[1]) <= round(took, 1), (said[1], took)  # the time it covers
    assert counted[2] == told.format(5001) and len(said) == 2


def test_one_more_is_said_in_the_singular(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        failures = FailureLog(WINDOW)
        failures.warn("127.0.0.1:9092", "upstream kafka-0:9092: timed out", "127.0.0.1:1")
        failures.warn("127.0.0.1:9092", "upstream kafka-0:9092: timed out", "127.0.0.1:2")
        await _until(lambda: len(_said(caplog)) == 2)
        failures.close()

    with caplog.at_level(logging.WARNING, logger="kafkatunnel.proxy"):
        asyncio.run(run())
    assert _said(caplog)[1].startswith("127.0.0.1:9092: 1 more connection failed the same way")
