"""Answers rewritten before, kept to be sent again: the same cluster answers the same
Metadata or FindCoordinator request with the same bytes, apart from the correlation id, to
every client and every refresh. Walking such an answer by its schema takes longer than the
rest of its way through the tunnel (7 us for a one-broker Metadata answer, where a small
Produce and its answer take 5 in all); looking it up takes a hash of its bytes.

An answer is taken from here only while the mapper still maps every broker it named to the
address it was rewritten with: whatever changed in the tunnel since (a broker learned, moved
or left unserved), a kept answer that names it is walked again. Nothing here trusts the
bytes more than the walk does: the same bytes walked with the same mapping give the same
rewrite.
"""

from __future__ import annotations

from kafkatunnel.protocol.framing import SIZE_PREFIX
from kafkatunnel.protocol.rewrite import BrokerAddress, Mapper, Rewritten, UnknownBroker

HEADER = SIZE_PREFIX + 4  # a response's size and correlation id: what differs between sends
Mapped = tuple[tuple[BrokerAddress, tuple[str, int] | None], ...]


class RewrittenAnswers:
    """A bounded store of rewritten answers by API, version and bytes after the correlation
    id (the oldest goes first when full; larger answers are not kept)."""

    def __init__(self, entries: int = 64, largest: int = 32 << 10) -> None:
        self.entries = entries
        self.largest = largest
        self._kept: dict[tuple[int, int, bytes], tuple[bytes, bool, Mapped]] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def find(
        self, api_key: int, api_version: int, frame: bytes, mapper: Mapper
    ) -> Rewritten | None:
        """The answer `frame` rewritten, with its own correlation id, if it was rewritten
        before with what `mapper` still says; None: rewrite it (and keep() it)."""
        if len(frame) > self.largest:
            return None
        key = (api_key, api_version, frame[HEADER:])
        kept = self._kept.get(key)
        if kept is None:
            return None
        rewritten, changed, mapped = kept
        try:
            still = all(mapper(address) == target for address, target in mapped)
        except UnknownBroker:
            still = False
        if not still:
            del self._kept[key]
            return None
        if changed:
            rewritten = b"".join((rewritten[:SIZE_PREFIX], frame[SIZE_PREFIX:HEADER],
                                  memoryview(rewritten)[HEADER:]))  # fmt: skip
        else:
            rewritten = frame
        return Rewritten(rewritten, tuple(address for address, _ in mapped), changed)

    def keep(
        self, api_key: int, api_version: int, frame: bytes, result: Rewritten, mapper: Mapper
    ) -> None:
        """Keep `frame`'s rewrite, with what `mapper` says of each broker it named."""
        if len(frame) > self.largest:
            return
        try:
            mapped = tuple((address, mapper(address)) for address in result.seen)
        except UnknownBroker:
            return
        if len(self._kept) >= self.entries:
            del self._kept[next(iter(self._kept))]
        self._kept[(api_key, api_version, frame[HEADER:])] = (result.frame, result.changed, mapped)
