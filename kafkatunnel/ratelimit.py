"""A log line for events that can come in floods (bad DNS packets, connections turned
away): counted always, logged at most every few seconds."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """Events are counted, and logged at most once per `interval` seconds with how many
    came and the last reason: a flood of garbage must not become a flood of log. `what`
    formats the count, the time since the last line, and the last reason."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.what = what
        self.interval = interval
        self.clock = clock
        self._last: float | None = None
        self._unlogged = 0

    def note(self, problem: str) -> None:
        self._unlogged += 1
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            return
        self.logger.warning(
            self.what,
            self._unlogged,
            "" if self._last is None else f" in {now - self._last:.0f}s",
            problem,
        )
        self._last = now
        self._unlogged = 0
