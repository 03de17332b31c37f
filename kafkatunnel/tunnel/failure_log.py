"""The log of what went wrong on client connections. When something makes every new
connection fail the same way (a forward down, a token ended, a client's TLS set up wrong),
clients reconnect at once and each failure would be a line: the first of a kind on a
listener is said in full, the same again within REPEAT_WINDOW seconds only counted, and one
line then says how many more came (as librdkafka suppresses its own repeated FAIL lines)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from kafkatunnel.ratelimit import First, More, Repeats

log = logging.getLogger("kafkatunnel.proxy")  # the connections' own
REPEAT_WINDOW = 30.0  # seconds the same failure on a listener is counted, not said
FAILED = "failed the same way"  # what the others did, for the count's line
Kind = tuple[str, str]  # a listener and a cause
NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class Told:
    """A line said in full: the listener, its words, and what the count says of others."""

    local: str
    message: str
    repeated: str


class FailureLog:
    """The thin I/O around Repeats: the loop's clock, a timer for windows that end with
    no new failure, and the log. One per tunnel, shared by its connections."""

    def __init__(self, window: float = REPEAT_WINDOW) -> None:
        self.repeats: Repeats[Kind, Told] = Repeats(window)
        self._timer: asyncio.TimerHandle | None = None

    def warn(self, local: str, message: str, peer: str, repeated: str = FAILED) -> None:
        """Say `message` of listener `local` unless it repeats. Two are the same when they
        differ only in what differs per connection: the client's address (`peer`), and
        numbers (a forward command's pid and the time in its last line of stderr)."""
        loop = asyncio.get_running_loop()
        told = Told(local, message, repeated)
        kind = (local, NUMBER.sub("#", message.replace(peer, "")))
        self._say(self.repeats.note(kind, told, loop.time()))
        self._wake_later(loop)

    def close(self) -> None:
        """The tunnel stops: the counts not said yet, over the time they cover."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._say(self.repeats.flush(asyncio.get_running_loop().time()))

    def _wake_later(self, loop: asyncio.AbstractEventLoop) -> None:
        due = self.repeats.next_due()
        if self._timer is None and due is not None:
            self._timer = loop.call_at(due, self._wake)

    def _wake(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        self._say(self.repeats.due(loop.time()))
        self._wake_later(loop)

    @staticmethod
    def _say(said: Sequence[First[Kind, Told] | More[Kind, Told]]) -> None:
        for line in said:
            if isinstance(line, First):
                log.warning("%s: %s", line.value.local, line.value.message)
            else:
                first = line.first
                log.warning("%s: %d more connection%s %s in the last %g s: %s", first.local,
                            line.count, "" if line.count == 1 else "s", first.repeated,
                            round(line.seconds, 1), first.message)  # fmt: skip
