"""Wait on conditions with deadlines, never on sleeps: a wait either sees its condition or
fails naming what it waited for and how long. Stands alone at the top: the local
cluster, the capture tools and the tests all wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """A condition did not hold before its deadline."""


class NeverHolds(RuntimeError):
    """Raised by a condition that knows it will never hold (the process it waits on has
    exited): the wait ends at once with it, not at its deadline."""


def wait_for(
    condition: Callable[[], T | bool | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.02,
) -> T:
    """Poll `condition` until it returns something truthy, and return that.

    Exceptions raised by the condition count as "not yet" (but NeverHolds, raised at
    once); the last one is chained to the DeadlineExceeded so a failing wait says why.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = condition()
            if result:
                return result  # type: ignore[return-value]
        except NeverHolds:
            raise
        except Exception as error:
            last_error = error
        if time.monotonic() >= deadline:
            raise DeadlineExceeded(f"timed out after {timeout:g}s waiting for {what}") from (
                last_error
            )
        time.sleep(interval)


async def async_wait_for(
    condition: Callable[[], Awaitable[T | bool | None]],
    *,
    timeout: float,
    what: str,
    interval: float = 0.02,
) -> T:
    """The asyncio form of `wait_for` (NeverHolds, too, ends it at once)."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = await condition()
            if result:
                return result  # type: ignore[return-value]
        except NeverHolds:
            raise
        except Exception as error:
            last_error = error
        if time.monotonic() >= deadline:
            raise DeadlineExceeded(f"timed out after {timeout:g}s waiting for {what}") from (
                last_error
            )
        await asyncio.sleep(interval)
