"""Log lines for events that can come in floods (bad DNS packets, connections turned away,
client connections failing the same way): counted always, logged at most every few
seconds."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar


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


# Kinds of event held at once by Repeats; past this many, a new kind is said in full, as if
# no limit were kept (distinct causes are news, and a hostile peer must not grow memory).
KINDS_HELD = 1000

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class First(Generic[K, V]):
    """Say `value` in full now: the first of its kind for a while."""

    key: K
    value: V


@dataclass(frozen=True)
class More(Generic[K, V]):
    """`count` more of the kind of `first` came in `seconds`, not said one by one."""

    key: K
    first: V
    count: int
    seconds: float


@dataclass
class _Window(Generic[V]):
    first: V
    start: float
    count: int = 0  # more of its kind since start


class Repeats(Generic[K, V]):
    """What to say of events that repeat (sans-I/O: the caller gives the time and says
    what it is told). The first of a kind (a key) is said at once; the same kind again
    within `window` seconds is only counted; when that window ends, one line says how many
    more came, and a new window begins, so a flood that goes on is told once a window.
    A window that ends with none forgets its kind: the next is said in full again."""

    def __init__(self, window: float, kinds: int = KINDS_HELD) -> None:
        self.window = window
        self.kinds = kinds
        self._windows: dict[K, _Window[V]] = {}

    def note(self, key: K, value: V, now: float) -> list[First[K, V] | More[K, V]]:
        """An event of kind `key` (`value`: its words) at `now`: what to say, in order (a
        window of its kind that ended before now first, then this one, if it is said)."""
        said: list[First[K, V] | More[K, V]] = [*self._end(key, now)]
        window = self._windows.get(key)
        if window is not None:
            window.count += 1
            return said
        if len(self._windows) < self.kinds:
            self._windows[key] = _Window(value, now)
        return [*said, First(key, value)]

    def due(self, now: float) -> list[More[K, V]]:
        """The windows ended by `now` that held more of their kind."""
        return [more for key in list(self._windows) for more in self._end(key, now)]

    def next_due(self) -> float | None:
        """When the first window still open ends (None: none is)."""
        return min((w.start + self.window for w in self._windows.values()), default=None)

    def flush(self, now: float) -> list[More[K, V]]:
        """Every window ended now (the caller stops): those that held more, over how long."""
        said = self.due(now)
        said += [More(key, w.first, w.count, now - w.start)
                 for key, w in self._windows.items() if w.count]  # fmt: skip
        self._windows.clear()
        return said

    def _end(self, key: K, now: float) -> list[More[K, V]]:
        """End the window of `key` if it ended by `now`: a count if it holds more (the
        next window begins where it ended), nothing if not (the kind is forgotten)."""
        window = self._windows.get(key)
        if window is None or now < window.start + self.window:
            return []
        del self._windows[key]
        if not window.count:
            return []
        end = window.start + self.window
        if now < end + self.window:  # the next window is still open
            self._windows[key] = _Window(window.first, end)
        return [More(key, window.first, window.count, self.window)]
