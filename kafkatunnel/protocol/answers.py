"""Answers rewritten before, kept to be sent again: the same cluster answers the same
Metadata, FindCoordinator or DescribeCluster request with the same bytes, apart from the
correlation id, to every client and every refresh. Walking such an answer by its schema
takes longer than the rest of its way through the tunnel (7 us for a one-broker Metadata
answer, where a small Produce and its answer take 5 in all); looking it up takes a hash of
its bytes.

Only those APIs' answers are kept: a Produce (v10+), ShareFetch or ShareAcknowledge answer
names brokers too, but carries offsets and records that never repeat, and a producer's
stream of them would push every answer that does repeat out of the store.

An answer is taken from here only while the mapper still maps every broker it named to the
address it was rewritten with: whatever changed in the tunnel since (a broker learned, moved
or left unserved), a kept answer that names it is walked again. Nothing here trusts the
bytes more than the walk does: the same bytes walked with the same mapping give the same
rewrite.
"""

from __future__ import annotations

from collections import OrderedDict

from kafkatunnel.protocol.framing import SIZE_PREFIX
from kafkatunnel.protocol.rewrite import BrokerAddress, Mapper, Rewritten, UnknownBroker

HEADER = SIZE_PREFIX + 4  # a response's size and correlation id: what differs between sends
METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER = 3, 10, 60
REPEATING_APIS = frozenset({METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER})
AnswerKey = tuple[int, int, bytes]  # API, version, the bytes after the correlation id
Mapped = tuple[tuple[BrokerAddress, tuple[str, int] | None], ...]


class RewrittenAnswers:
    """A bounded store of rewritten answers by API, version and bytes after the correlation
    id (the least recently sent goes first when full; larger answers are not kept)."""

    def __init__(self, entries: int = 64, largest: int = 32 << 10) -> None:
        self.entries = entries
        self.largest = largest
        self._kept: OrderedDict[AnswerKey, tuple[bytes, bool, Mapped]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def find(
        self, api_key: int, api_version: int, frame: bytes, mapper: Mapper
    ) -> tuple[Rewritten | None, AnswerKey | None]:
        """The answer `frame` rewritten, with its own correlation id, if it was rewritten
        before with what `mapper` still says; else None and the key to keep() its rewrite
        under (None: an answer not kept, of an API whose answers do not repeat or too large).
        """
        if api_key not in REPEATING_APIS or len(frame) > self.largest:
            return None, None
        key = (api_key, api_version, frame[HEADER:])
        kept = self._kept.get(key)
        if kept is None:
            return None, key
        rewritten, changed, mapped = kept
        try:
            still = all(mapper(address) == target for address, target in mapped)
        except UnknownBroker:
            still = False
        if not still:
            del self._kept[key]
            return None, key
        self._kept.move_to_end(key)  # sent again: the last to go
        if changed:
            rewritten = b"".join((rewritten[:SIZE_PREFIX], frame[SIZE_PREFIX:HEADER],
                                  memoryview(rewritten)[HEADER:]))  # fmt: skip
        else:
            rewritten = frame
        return Rewritten(rewritten, tuple(address for address, _ in mapped), changed), key

    def keep(self, key: AnswerKey, result: Rewritten, mapper: Mapper) -> None:
        """Keep the rewrite of the answer find() gave `key` for, with what `mapper` says of
        each broker it named."""
        try:
            mapped = tuple((address, mapper(address)) for address in result.seen)
        except UnknownBroker:
            return
        if len(self._kept) >= self.entries:
            self._kept.popitem(last=False)
        self._kept[key] = (result.frame, result.changed, mapped)
