"""Waits that end at once when what they wait on is gone (a process that exited)."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from kafkatunnel.demo.processes import ManagedProcess
from kafkatunnel.waiting import NeverHolds, async_wait_for

pytestmark = pytest.mark.quick


def test_waiting_for_a_line_of_a_process_that_exited_fails_at_once_naming_the_exit() -> None:
    """Not at its deadline: with the exit treated as "not yet", this wait would end after
    its 600 s as a DeadlineExceeded (the suite's own timeout stops it first)."""
    gone = ManagedProcess([sys.executable, "-c", "print('starting'); raise SystemExit(3)"],
                          name="exits-at-once")  # fmt: skip
    try:
        with pytest.raises(NeverHolds, match=r"exits-at-once exited with 3 before printing"):
            gone.wait_for_line(r"^never printed$", timeout=600)
    finally:
        gone.stop()


def test_waiting_for_a_port_of_a_process_that_exited_fails_at_once() -> None:
    gone = ManagedProcess([sys.executable, "-c", "raise SystemExit(4)"], name="never-listens")
    try:
        with pytest.raises(NeverHolds, match="never-listens exited with 4 before accepting"):
            gone.wait_accepting(1, timeout=600)
    finally:
        gone.stop()


def test_an_async_wait_on_a_condition_that_never_holds_ends_at_once() -> None:
    async def gone() -> bool:
        raise NeverHolds("the process exited")

    started = time.monotonic()
    with pytest.raises(NeverHolds, match="exited"):
        asyncio.run(async_wait_for(gone, timeout=600, what="a process"))
    assert time.monotonic() - started < 60
