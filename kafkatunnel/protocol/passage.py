"""One proxied connection's two byte streams, frame by frame, copying as little as possible.

Each direction reads just the head of a frame (a copy of a few bytes) and decides: pass the
rest through untouched (slices of the very buffers that arrived), or hold the whole frame
because it must change. Requests are observed (their headers tell what each response will
be), and changed only by a Policy: refused (see Exchange.refuse), or amended. Responses are
held whole only when they can name a broker, are ApiVersions answers (to be capped) or stand
for a refusal; a 1 MiB Fetch response passes through as it arrives.
"""

from __future__ import annotations

import functools
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, Protocol, TypeVar

from kafkatunnel.protocol.answers import RewrittenAnswers
from kafkatunnel.protocol.api_versions import cap_api_versions
from kafkatunnel.protocol.correlation import CorrelationTracker, InFlight
from kafkatunnel.protocol.deployed_offsets import (
    OFFSET_FETCH,
    Seeds,
    deployed_offsets,
    deployed_requests,
    seeded_answer,
)
from kafkatunnel.protocol.errors import (
    FrameSizeError,
    MalformedMessage,
    ProtocolError,
    RefusedUnanswerable,
    TruncatedFrame,
)
from kafkatunnel.protocol.framing import DEFAULT_MAX_FRAME_SIZE, SIZE_PREFIX
from kafkatunnel.protocol.headers import (
    API_VERSIONS,
    RequestHeader,
    expects_response,
    parse_request_header,
    response_correlation_id,
    response_header_version,
    top_level_error,
)
from kafkatunnel.protocol.isolation import (
    PRODUCE,
    Isolation,
    isolate_produce_head,
    isolate_request,
    request_ids,
    response_ids,
    restore_response,
)
from kafkatunnel.protocol.policy import GroupMembers, Policy
from kafkatunnel.protocol.refusal import refused_answer
from kafkatunnel.protocol.rewrite import (
    BrokerAddress,
    Mapper,
    UnknownBroker,
    addresses_in,
    needs_rewrite,
    rewrite_response,
)
from kafkatunnel.protocol.schema import StructPlan, api_title
from kafkatunnel.protocol.streaming import (
    AFTER_RECORDS,
    RESPONSE_WALK_START,
    TAIL,
    Got,
    Walk,
    addresses_in_tail,
    carrying_records,
    rewrite_tail,
    streamable,
    walk,
)

T = TypeVar("T")
Chunk = bytes | memoryview
# A frame as it passed on: chunks of its bytes, and (ints) runs of record data that passed
# unread, spliced or (records_only) within a read.
Part = Chunk | int
# Where a walk found a frame's record data (offsets in the frame), and whether the message's
# encodings are compact (a flexible version).
RecordSpans = tuple[tuple[tuple[int, int], ...], bool]
# A request's header as read here, and whether it is answered.
ReadRequest = tuple[RequestHeader, bool]
REQUEST_HEAD = 1024  # enough for a header, a Produce's transactional id and acks
_SIZE = struct.Struct(">i")  # a frame's size prefix


# Coordinator answers whose top-level error code comes first (after the throttle time):
# FindCoordinator v0-3, JoinGroup, Heartbeat, LeaveGroup, SyncGroup, InitProducerId,
# AddOffsetsToTxn, EndTxn, ConsumerGroupHeartbeat.
ERROR_FIRST_APIS = frozenset({10, 11, 12, 13, 14, 22, 25, 26, 68})


class FramePassed(NamedTuple):
    """An event, for an observer (see Exchange.observe): a frame has passed on whole."""

    parts: list[Part]
    records: RecordSpans | None  # where its record data lay, if it was walked to its end
    request: ReadRequest | None  # a request's header


class Fed(NamedTuple):
    """What a direction hands its caller for the bytes it was given."""

    out: list[Chunk]  # to pass on now, in order
    # Brokers an answer names that the mapper does not know: give each a tunnel address,
    # then resume(); the direction holds everything after that answer until then.
    unknown_brokers: tuple[BrokerAddress, ...] = ()
    frames: Sequence[FramePassed] = ()  # frames that passed on whole (when observed)
    refused: Sequence[RequestHeader] = ()  # requests a Policy refused (to count, to say)
    # A request stopped at (--isolate-from-deployed): ask the deployed groups what it asks,
    # hand the answers to Exchange.deployed_answered, then resume()
    deployed_wanted: DeployedAsk | None = None


class DeployedAsk(NamedTuple):
    """What an isolated client's OffsetFetch asks, to be asked of the deployed groups of
    the names it uses first (deployed_offsets): each group's own request frame, for that
    group's coordinator."""

    correlation_id: int
    api_version: int
    requests: Mapping[str, bytes]  # group (as the client and the deployed one name it)


class Head(Enum):
    """What a direction does with a frame whose head it has read (or a Walk: walk it)."""

    PASS = "pass it through, head first, unread"
    HOLD = "hold it whole for on_frame"
    REPLACE = "pass it through unread, its head first as on_head replaced it (replace_head)"


class DeployedWanted(Exception):
    """A request waits for the deployed groups' offsets (raised inside this module only: a
    Direction stops there and hands the ask to its caller)."""

    def __init__(self, ask: DeployedAsk) -> None:
        super().__init__(f"the deployed offsets of {', '.join(ask.requests)} wanted")
        self.ask = ask


class BrokersUnknown(Exception):
    """An answer names brokers the mapper has no tunnel address for yet (raised inside this
    module only: a Direction stops there and hands them to its caller)."""

    def __init__(self, brokers: tuple[BrokerAddress, ...]) -> None:
        super().__init__(f"{len(brokers)} brokers not learned yet")
        self.brokers = brokers


@dataclass(frozen=True, slots=True)
class _Stop:
    """Where a direction stopped: the frame (or walked frame's tail) that names brokers
    not learned yet, and every broker it names; or a request that waits for the deployed
    groups' offsets."""

    held: bytes
    tail: bool
    brokers: tuple[BrokerAddress, ...]
    deployed: DeployedAsk | None = None


@dataclass
class ExchangeStats:
    requests: dict[int, int] = field(default_factory=dict)  # per API key
    responses: int = 0
    rewritten: int = 0
    errors: dict[int, int] = field(default_factory=dict)  # coordinator answers' error codes
    refused: dict[int, int] = field(default_factory=dict)  # per API key, by a Policy


class _Splitter:
    """Cuts one direction of a stream into frames; subclasses decide per frame head."""

    def __init__(self, max_frame_size: int, head_size: int, records_only: bool) -> None:
        self.max_frame_size = max_frame_size
        self.head_size = head_size
        # Only record data may pass unread: everything else is read (a recording keeps it).
        self.records_only = records_only
        self._held = bytearray()
        self._hold_to = SIZE_PREFIX  # bytes to hold before the next step: a prefix, a head...
        self._size = -1  # size of the current frame, once its prefix is read
        self._whole = False  # holding the whole current frame
        self._pass_on = 0  # bytes of the current frame still to pass through
        self._walk: Walk | None = None  # the current frame is walked as it streams
        self._unwalked = 0  # bytes of a walked frame not yet taken by its walk
        self._tail_next = False  # the walk's current need is the rest of the frame
        # A walk that rewrites nothing (it finds the records to splice): a frame it cannot
        # walk passes on read, as an unwalked frame would, rather than ending the connection.
        self._walk_may_fail = False
        # Observed (a recording, see observe): the current frame's parts so far (None:
        # nobody observes), the frames that passed on whole since the caller last heard,
        # where the walk found record data, and a request's header.
        self._parts: list[Part] | None = None
        self._passed: list[FramePassed] = []
        self._before_error = Fed([])  # what passed on in the call that raised ProtocolError
        self._spans: list[tuple[int, int]] = []
        self._records: RecordSpans | None = None
        self._compact = False  # the walked message is of a flexible version
        self._request: ReadRequest | None = None
        # What an observer sees of a frame on_frame changed into something else than its
        # own rewrite (a refused request: itself, not what went on in its place).
        self._shown: bytes | None = None
        self._refused: list[RequestHeader] = []  # refused since the caller last heard
        self._walk_from = 0  # where in the frame its walk starts
        # What on_head sends instead of the head's first bytes (Head.REPLACE, or a walk
        # from where they end), and how many of them; a walk's record spans then lie
        # `_shift` bytes further into the frame as it passed on.
        self._instead: tuple[bytes, int] | None = None
        self._shift = 0
        # Stopped at an answer naming brokers not learned yet (see Fed.unknown_brokers),
        # and the bytes fed since, to be read on resume().
        self._stop: _Stop | None = None
        self._unfed: list[Chunk] = []
        # Asked to pause (see pause): nothing after the current frame passes until
        # unpause(). A plain attribute: what every read checks first, so the rest of the
        # pause (paused, a property) is asked only while one is on.
        self.pausing = False

    @property
    def mid_frame(self) -> bool:
        return bool(self._held) or self._pass_on > 0 or self._walk is not None

    @property
    def paused(self) -> bool:
        """Paused, and the frame in progress when it was has passed on whole: what comes
        now waits for unpause()."""
        return self.pausing and self._between_frames

    @property
    def _between_frames(self) -> bool:
        return self._size < 0 and not self.mid_frame

    def pause(self) -> None:
        """Let the frame in progress pass on whole, and hold back everything after it
        (the tunnel's own login goes between frames). The I/O layer stops reading once
        `paused`: what it read meanwhile is kept, at most one read's worth."""
        self.pausing = True

    def unpause(self) -> Fed:
        """Go on: what was held back, to pass on now (it may stop at an answer, as feed)."""
        self.pausing = False
        if self._stop is not None:
            return Fed([])
        out: list[Chunk] = []
        try:
            self._feed_unfed(out)
        except ProtocolError:
            self._before_error = self._fed(out)
            raise
        return self._fed(out)

    def _feed_unfed(self, out: list[Chunk]) -> None:
        """Read what was kept back (at a stop, or paused), until it stops again."""
        unfed, self._unfed = self._unfed, []
        for index, data in enumerate(unfed):
            self._feed(memoryview(data), out)
            if self._stop is not None:
                self._unfed.extend(unfed[index + 1 :])
                break

    @property
    def unread(self) -> int:
        """Bytes of the current frame that may pass on without being read at all: the I/O
        layer can move them outside this object (splice) and then call skip()."""
        if self._stop is not None:
            return 0
        if self.records_only and self._walk is None:
            return 0  # passing, but to be read: only a walk's records go unread
        return self._pass_on

    @property
    def awaited(self) -> int:
        """Bytes still missing of a frame held whole (the I/O layer reads them in bulk)."""
        if self._stop is not None:
            return 0
        return self._hold_to - len(self._held) if self._whole or self._tail_next else 0

    def resume(self) -> Fed:
        """Go on from where feed() stopped, once its unknown brokers are learned: the answer
        rewritten, then whatever was fed after it (which may stop again, at a later answer)."""
        stop, self._stop = self._stop, None
        out: list[Chunk] = []
        if stop is None:
            return Fed(out)
        try:
            if stop.tail:
                self._tail_read(stop.held, out)
            else:
                self._whole_frame(stop.held, out)
            if self._stop is not None:
                early = self._stop.deployed or self._stop.brokers
                raise RuntimeError(f"resumed before learning what it waits for: {early}")
            self._feed_unfed(out)
        except ProtocolError:
            self._before_error = self._fed(out)
            raise
        return self._fed(out)

    def observe(self) -> None:
        """Hand over every frame once it has passed on whole (Fed.frames): a recording
        needs no framing of its own, and never sees record data left unread."""
        self._parts = []

    def skip(self, count: int) -> Sequence[FramePassed]:
        """`count` bytes of the unread remainder went on without passing through feed():
        the frames that passed on whole with them (when observed)."""
        if not 0 <= count <= self._pass_on:
            raise ValueError(f"cannot skip {count} bytes: only {self._pass_on} may pass unread")
        self._pass_on -= count
        if self._parts is not None:
            self._unread_part(count)
        try:
            if not self._pass_on:
                if self._walk is not None:
                    if not self._unwalked:  # records end the frame: the walk's end (_next)
                        self._resume(b"")
                elif self._parts is not None:
                    self._frame_seen()
        except ProtocolError:  # the frames seen whole before still count as passed
            self._before_error = Fed([], (), self._take_passed())
            raise
        return self._take_passed()

    def feed(self, data: Chunk) -> Fed:
        """What of `data` (and what came before) passes on now."""
        out: list[Chunk] = []
        if self._stop is not None or (self.pausing and self._between_frames):
            self._unfed.append(data)
            return self._fed(out)
        view = memoryview(data)
        end = len(view)
        try:
            if self._size < 0 and not self._held and not self._pass_on and self._walk is None:
                pos = self._whole_frames(view, end, out)  # between frames: most reads
                if pos == end and self._stop is None and not self._passed and not self._refused:
                    return Fed(out)
            else:
                pos = 0
            self._feed(view, out, pos)
        except ProtocolError:  # what came whole before the bad bytes still goes
            self._before_error = self._fed(out)
            raise
        return self._fed(out)

    def _fed(self, out: list[Chunk]) -> Fed:
        stop = self._stop
        if stop is None and not self._passed and not self._refused:
            return Fed(out)
        refused, self._refused = self._refused, []
        if stop is None:
            return Fed(out, (), self._take_passed(), refused)
        return Fed(out, stop.brokers, self._take_passed(), refused, stop.deployed)

    def _take_passed(self) -> Sequence[FramePassed]:
        if not self._passed:
            return ()
        passed, self._passed = self._passed, []
        return passed

    def taken_before_error(self) -> Fed:
        """What passed on, in the call that raised ProtocolError, of the bytes before the
        bad ones (a whole answer ahead of a broken one, say): still to be delivered."""
        taken, self._before_error = self._before_error, Fed([])
        return taken

    def _feed(self, view: memoryview, out: list[Chunk], pos: int = 0) -> None:
        """From `pos` on: what passes is appended to `out`."""
        end = len(view)
        run = -1  # view[run:pos] passes on unchanged and is not in out yet
        while pos < end and self._stop is None:
            if self.pausing and self._between_frames:
                break  # held back: to be read on unpause()
            if self._pass_on:
                take = min(self._pass_on, end - pos)
                if run < 0:
                    run = pos
                if self._parts is not None:  # records_only: a walk's records stay unread
                    if self._walk is not None and self.records_only:
                        self._unread_part(take)
                    else:
                        self._parts.append(view[pos : pos + take])
                pos += take
                self._pass_on -= take
                if not self._pass_on:
                    if self._walk is not None:
                        if not self._unwalked:  # records end the frame: the walk's end
                            self._resume(b"")
                    elif self._parts is not None:
                        self._frame_seen()
                continue
            if (
                self._walk is not None
                and not self._tail_next
                and not self._held
                and self._hold_to <= end - pos
            ):  # the walk reads what is here where it lies; it passes on as is
                if run < 0:
                    run = pos
                pos += self._resume(view[pos : pos + min(end - pos, self._unwalked)])
                continue
            if run >= 0:
                out.append(view[run:pos])
                run = -1
            take = min(self._hold_to - len(self._held), end - pos)
            self._held += view[pos : pos + take]
            pos += take
            if len(self._held) < self._hold_to:
                break
            held = bytes(self._held)
            if self._walk is not None:
                self._held.clear()
                if self._tail_next:
                    self._tail_read(held, out)
                    continue
                used = self._resume(held)
                out.append(held if used == len(held) else held[:used])
                if used < len(held):  # read by whatever comes next: records, say
                    self._feed(memoryview(held)[used:], out)
                continue
            if self._size < 0:
                self._start_frame()
                if len(self._held) < self._hold_to:
                    continue
                held = bytes(self._held)
            if self._whole:
                self._whole_frame(held, out)
                continue
            self._head_read(held, out)
        if run >= 0:
            out.append(view[run:pos])
        if pos < end:  # stopped: kept for resume(), after what an inner _feed kept
            self._unfed.append(bytes(view[pos:]))

    def _whole_frames(self, view: memoryview, end: int, out: list[Chunk]) -> int:
        """The frames that lie whole in `view` from its start and pass unchanged (a small
        request, its answer): one slice of the bytes that arrived, no holding, no copy but
        each head's. The first frame that does not lie whole, or that on_head does not pass,
        is left where the general path takes it (a frame on_head saw is left decided).
        Returns how far the frames passed go."""
        pos = 0
        head_size, limit, parts = self.head_size, self.max_frame_size, self._parts
        while end - pos >= SIZE_PREFIX:
            (size,) = _SIZE.unpack_from(view, pos)
            start = pos + SIZE_PREFIX
            stop = start + size
            if size < 0 or size > limit or stop > end:
                break  # the general path reads on, or names the wrong size
            head_end = stop if size <= head_size else start + head_size
            head = bytes(view[pos:head_end])
            try:
                decision = self.on_head(head, head_end == stop)
            except ProtocolError:
                if pos:  # the frames before it passed
                    out.append(view[:pos])
                raise
            if decision is not Head.PASS:  # from here the general path goes on
                if pos:
                    out.append(view[:pos])
                self._held += head
                self._size, self._hold_to = size, head_end - pos
                self._decided(decision, head, out)
                return head_end
            if parts is not None:
                parts.append(head)
                if stop > head_end:
                    parts.append(view[head_end:stop])
                self._frame_seen()
                parts = self._parts
            pos = stop
        if pos:
            out.append(view[:pos])
        return pos

    def _head_read(self, held: bytes, out: list[Chunk]) -> None:
        """A frame's head is here: pass the frame through, hold it whole, or walk it, as
        on_head decides."""
        self._decided(self.on_head(held, complete=len(held) == SIZE_PREFIX + self._size),
                      held, out)  # fmt: skip

    def _decided(self, decision: Head | Walk, held: bytes, out: list[Chunk]) -> None:
        if decision is Head.PASS or decision is Head.REPLACE:
            first = held if decision is Head.PASS else self._replaced(held)
            out.append(first)
            self._pass_on = SIZE_PREFIX + self._size - len(held)
            self._reset()
            if self._parts is not None:
                self._parts.append(first)
                if not self._pass_on:
                    self._frame_seen()
        elif decision is Head.HOLD:
            self._whole = True
            self._hold_to = SIZE_PREFIX + self._size
            if len(held) == self._hold_to:
                self._whole_frame(held, out)
        else:  # walk the frame as it streams, from where on_head said (see walking)
            start = self._walk_from
            self._shift = 0
            if self._instead is None:
                out.append(held[:start])
            else:
                out.append(self._replaced(held[:start]))
                self._shift = len(out[-1]) - start
            if self._parts is not None:
                self._parts.append(out[-1])
            self._walk, self._unwalked = decision, SIZE_PREFIX + self._size - start
            self._held.clear()
            self._resume(None)
            self._feed(memoryview(held)[start:], out)  # what the head held beyond

    def _replaced(self, held: bytes) -> bytes:
        """`held` with its first bytes replaced as on_head said (replace_head)."""
        instead = self._instead
        assert instead is not None
        self._instead = None
        return instead[0] + held[instead[1] :]

    def replace_head(self, instead: bytes, used: int) -> None:
        """For on_head, returning Head.REPLACE or a walk from `used`: send `instead` in
        place of the frame's first `used` bytes (its size prefix among them, made right)."""
        self._instead = (instead, used)

    def _whole_frame(self, held: bytes, out: list[Chunk]) -> None:
        """A frame held whole: pass on what on_frame makes of it."""
        if self._made(held, False, out):
            self._reset()
            self._last_part_seen(out)

    def _tail_read(self, tail: bytes, out: list[Chunk]) -> None:
        """A walked frame's tail is here: pass on what on_tail makes of it."""
        if self._made(tail, True, out):
            self._walk, self._tail_next, self._walk_may_fail = None, False, False
            self._note_record_spans()
            self._reset()
            self._last_part_seen(out)

    def _made(self, data: bytes, tail: bool, out: list[Chunk]) -> bool:
        """Append what on_frame (on_tail) makes of `data`; False: stopped instead, at an
        answer naming brokers not learned yet (see Fed.unknown_brokers)."""
        try:
            out.append(self.on_tail(data) if tail else self.on_frame(data))
        except BrokersUnknown as stop:
            self._stop = _Stop(data, tail, stop.brokers)
            return False
        except DeployedWanted as stop:
            self._stop = _Stop(data, tail, (), stop.ask)
            return False
        return True

    def _last_part_seen(self, out: list[Chunk]) -> None:
        """The frame's last part is the last chunk out: an observer sees the frame now."""
        shown, self._shown = self._shown, None
        if self._parts is not None:
            self._parts.append(out[-1] if shown is None else shown)
            self._frame_seen()

    def _resume(self, sent: Got | None) -> int:
        """Send the walk the frame's bytes on hand (None: start it) and set up its next step
        (see _next); how many of them it read, which pass on as they are."""
        walk = self._walk
        assert walk is not None
        try:
            used, step = walk.send(sent)  # type: ignore[arg-type]
        except StopIteration as end:
            self._walk_read(sent, end.value)
            self._walk_stopped(None)
            return end.value  # type: ignore[no-any-return]
        except MalformedMessage as error:
            used = len(sent) if sent else 0  # read, as what is left of the frame will be
            self._walk_read(sent, used)
            self._walk_stopped(error)
            return used
        if used:
            self._walk_read(sent, used)
        self._next(step)
        return used

    def _walk_read(self, sent: Got | None, used: int) -> None:
        """The walk read `used` bytes of those sent."""
        self._unwalked -= used
        if used and self._parts is not None:
            assert sent is not None
            self._parts.append(sent if used == len(sent) else sent[:used])

    def _next(self, step: int) -> None:
        """Set up the walk's next step: bytes to hold for it, bytes to pass unread (records),
        or the tail."""
        try:
            if step == TAIL:
                if not self._unwalked:
                    raise MalformedMessage("the frame ends before its tagged fields")
                self._tail_next, self._hold_to = True, self._unwalked
            elif step > 0:
                if not self._unwalked:
                    raise MalformedMessage("a field runs past the end of its frame")
                self._hold_to = min(step, self._unwalked)  # fewer: the walk sees the frame end
            else:
                if -step > self._unwalked:
                    raise MalformedMessage("records run past the end of their frame")
                at = SIZE_PREFIX + self._size - self._unwalked + self._shift
                self._spans.append((at, at - step))
                self._unwalked += step
                self._pass_on = -step
                self._hold_to = min(AFTER_RECORDS, self._unwalked)  # then sent what follows
        except MalformedMessage as error:
            self._walk_stopped(error)

    def _walk_stopped(self, error: MalformedMessage | None) -> None:
        """The walk ended: at its message's end (error None), or on bytes it cannot walk
        (raised again unless the walk is lenient)."""
        if error is not None and not self._walk_may_fail:
            raise error
        if error is None and not self._unwalked:
            self._note_record_spans()
        self._leave_walk()

    def _leave_walk(self) -> None:
        """The walk is over; whatever is left of the frame passes on (read)."""
        self._walk, self._walk_may_fail = None, False
        self._spans = []
        self._pass_on = self._unwalked
        self._reset()
        if not self._pass_on and self._parts is not None:
            self._frame_seen()

    def _note_record_spans(self) -> None:
        """A frame was walked to its end: note where its record data lay."""
        self._records = (tuple(self._spans), self._compact)
        self._spans = []

    def _unread_part(self, count: int) -> None:
        """`count` bytes of the current frame passed on unread: one run with any before."""
        parts = self._parts
        assert parts is not None
        last = parts[-1] if parts else None
        if isinstance(last, int):
            parts[-1] = last + count
        else:
            parts.append(count)

    def _frame_seen(self) -> None:
        """The current frame has passed on whole: the observer hears of it."""
        assert self._parts is not None
        parts, self._parts = self._parts, []
        records, self._records = self._records, None
        request, self._request = self._request, None
        self._passed.append(FramePassed(parts, records, request))

    def walking(self, steps: Walk, start: int, compact: bool, lenient: bool) -> Walk:
        """For on_head: walk this frame from `start` (an offset within its head; compact:
        a flexible version's encodings)."""
        self._walk_from, self._compact, self._walk_may_fail = start, compact, lenient
        return steps

    def _start_frame(self) -> None:
        size = int.from_bytes(self._held[:SIZE_PREFIX], "big", signed=True)
        if size < 0 or size > self.max_frame_size:
            raise FrameSizeError(
                f"frame size {size} is "
                + ("negative" if size < 0 else f"above the maximum of {self.max_frame_size}")
                + " (not a Kafka stream, or a TLS/SASL peer talking to a plaintext port?)"
            )
        self._size = size
        self._hold_to = SIZE_PREFIX + min(size, self.head_size)

    def _reset(self) -> None:
        self._held.clear()
        self._hold_to = SIZE_PREFIX  # bytes to hold before the next step: a prefix, a head...
        self._size = -1
        self._whole = False

    def close(self) -> None:
        if self.mid_frame:
            raise TruncatedFrame("the stream ended in the middle of a frame")

    def on_head(self, head: bytes, complete: bool) -> Head | Walk:
        """Head.PASS: pass this frame through (head first); Head.HOLD: hold it whole for
        on_frame; a Walk (made with walking()): walk it as it streams (see streaming), its
        tail going to on_tail."""
        raise NotImplementedError

    def on_frame(self, whole: bytes) -> bytes:
        raise NotImplementedError

    def on_tail(self, tail: bytes) -> bytes:
        raise NotImplementedError


class _Requests(_Splitter):
    def __init__(self, exchange: Exchange, max_frame_size: int, records_only: bool) -> None:
        super().__init__(max_frame_size, REQUEST_HEAD, records_only)
        self.exchange = exchange
        self.policy = exchange.policy

    def on_head(self, head: bytes, complete: bool) -> Head | Walk:
        isolation = self.exchange.isolation
        try:
            header = parse_request_header(head)
            policy = self.policy
            if policy is not None and policy.held(header.api_key):
                return Head.HOLD  # decided whole: refused, or perhaps (see policy)
            wanted = expects_response(head, header)
            instead = None
            if isolation is not None and request_ids(header.api_key, header.api_version):
                if header.api_key != PRODUCE or header.body_offset is None:
                    return Head.HOLD  # its ids isolated in on_frame
                instead = isolate_produce_head(head, header.body_offset, header.api_version,
                                               isolation)  # fmt: skip
        except MalformedMessage:
            if complete:
                raise
            return Head.HOLD  # the header is longer than the head: look at the whole frame
        self.exchange.observe_request(header, wanted)
        self._request = (header, wanted)
        if self.records_only and header.body_offset is not None:
            plan = carrying_records(header.api_key, header.api_version, response=False)
            if plan is not None:  # a Produce request: its records pass unread
                if instead is None:
                    steps = walk(plan, header_tags=False, tail=False)  # the header is read
                    return self.walking(steps, header.body_offset, plan.flexible, True)
                self.replace_head(*instead)  # the walk goes on after the transactional id
                steps = walk(plan, header_tags=False, tail=False, after=1)
                return self.walking(steps, instead[1], plan.flexible, True)
        if instead is not None:  # a transactional Produce: its records pass unread
            self.replace_head(*instead)
            return Head.REPLACE
        return Head.PASS

    def on_frame(self, whole: bytes) -> bytes:
        header = parse_request_header(whole)
        wanted = expects_response(whole, header)
        exchange = self.exchange
        if exchange.seeding(header):  # may stop: DeployedWanted
            ask = DeployedAsk(header.correlation_id, header.api_version,
                              deployed_requests(whole, header))  # fmt: skip
            raise DeployedWanted(ask)
        self._request = (header, wanted)
        policy = exchange.policy
        if policy is not None and policy.held(header.api_key):
            if policy.refuses(header, whole, exchange.members):
                self._refused.append(header)
                instead = exchange.refuse(header, wanted, whole)
                self._shown = whole
                return instead
            exchange.observe_request(header, wanted)
            return exchange.isolated(header, policy.amended(header, whole) or whole)
        exchange.observe_request(header, wanted)
        return exchange.isolated(header, whole)


RESPONSE_HEAD = 16  # the correlation id decides; a top-level error code is within 16 bytes


class _Answer(Enum):
    """What a direction does with an answer, by its request's API and version."""

    PASS = "pass it through unread"
    COUNT_ERROR = "pass it through, counting its top-level error code (a coordinator's)"
    HOLD = "hold it whole: it may name a broker, or is an ApiVersions answer to cap"
    STREAM = "walk it as it streams: it names brokers only in its top-level tags"
    RECORDS = "walk it (a recording's) so that only its records pass unread"


@functools.cache  # asked once per answer, of a handful of distinct pairs
def _treatment(
    api_key: int, api_version: int, records_only: bool, isolated: bool = False
) -> tuple[_Answer, StructPlan | None]:
    """How an answer is passed on, and the plan of one that is walked (isolated: ids in
    it are mapped back). A rewritten API at a version this layer does not know raises
    (needs_rewrite), every time: not cached."""
    plan = streamable(api_key, api_version)
    if plan is not None:  # Produce and Fetch answers: they carry no group or producer id
        return _Answer.STREAM, plan
    if api_key == API_VERSIONS or needs_rewrite(api_key, api_version):
        return _Answer.HOLD, None
    if isolated and response_ids(api_key, api_version) is not None:
        return _Answer.HOLD, None
    if records_only:
        plan = carrying_records(api_key, api_version, response=True)
        if plan is not None:  # a Fetch answer that names no broker: records pass unread
            return _Answer.RECORDS, plan
    if api_key in ERROR_FIRST_APIS:
        return _Answer.COUNT_ERROR, None
    return _Answer.PASS, None


class _Responses(_Splitter):
    def __init__(self, exchange: Exchange, max_frame_size: int, records_only: bool) -> None:
        super().__init__(max_frame_size, RESPONSE_HEAD, records_only)
        self.exchange = exchange
        self.refusals = exchange.refusals  # the same dict
        self._current: InFlight | None = None
        self._plan: StructPlan | None = None  # of the response being walked

    def on_head(self, head: bytes, complete: bool) -> Head | Walk:
        correlation_id = response_correlation_id(head)
        request = self.exchange.tracker.response(correlation_id)
        self.exchange.stats.responses += 1
        if self.refusals and correlation_id in self.refusals:
            self._current = request  # the broker's answer in a refusal's place
            return Head.HOLD
        isolated = self.exchange.isolation is not None
        treatment, plan = _treatment(request.api_key, request.api_version, self.records_only,
                                     isolated)  # fmt: skip
        if treatment is _Answer.PASS:
            return Head.PASS
        if treatment is _Answer.HOLD:
            self._current = request
            return Head.HOLD
        if treatment is _Answer.COUNT_ERROR:
            self.exchange.observe_error(request, head)
            return Head.PASS
        assert plan is not None
        if treatment is _Answer.STREAM:
            self._current, self._plan = request, plan
            return self.walking(walk(plan), RESPONSE_WALK_START, compact=True, lenient=False)
        header_tags = response_header_version(request.api_key, request.api_version) == 1
        steps = walk(plan, header_tags=header_tags, tail=False)
        return self.walking(steps, RESPONSE_WALK_START, plan.flexible, lenient=True)

    def on_frame(self, whole: bytes) -> bytes:
        request = self._current
        assert request is not None
        refused = self.refusals.pop(request.correlation_id, None)
        if refused is not None:
            self._current = None
            self._shown = refused  # a recording sees the request's answer, as the client
            return refused
        out, cluster_ids = self.exchange.transform_response(request, whole)  # may stop:
        self._current = None  # BrokersUnknown
        if cluster_ids is not None:
            self._shown = cluster_ids  # a recording holds the ids the cluster has
        if request.api_key in ERROR_FIRST_APIS:
            self.exchange.observe_error(request, out)
        return out

    def on_tail(self, tail: bytes) -> bytes:
        request, plan = self._current, self._plan
        assert request is not None and plan is not None
        out = self.exchange.transform_tail(plan, tail)  # may stop: BrokersUnknown
        self._current = self._plan = None
        return out


class Exchange:
    """The protocol state of one proxied connection: both directions, their correlation,
    and the rewriting of what the broker says."""

    def __init__(
        self,
        mapper: Mapper,
        caps: dict[int, range],
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        records_only: bool = False,
        answers: RewrittenAnswers | None = None,
        policy: Policy | None = None,
        isolation: Isolation | None = None,
        groups: set[str] | None = None,
    ) -> None:
        """records_only: let only record data pass unread (a recording reads the rest).
        answers: answers rewritten before with this mapper (shared by the connections that
        use it), to send again rather than walk again. policy: the requests refused.
        isolation: the group and transactional ids mapped (`up --isolate`); the group
        ids it isolated are added to `groups` (the client's names: shared by connections)."""
        self.mapper = mapper
        self.answers = answers
        self.policy = policy
        self.isolation = isolation
        self.groups: set[str] = set() if groups is None else groups
        # --isolate-from-deployed: the deployed groups' offsets, by the correlation id of
        # the OffsetFetch they seed (with the group of a request before v8)
        self.seeds: dict[int, tuple[str | None, Seeds]] = {}
        self.members = GroupMembers()  # the client's own, in its groups (see policy)
        # The answers to refused requests, by correlation id, each waiting for the broker's
        # answer to what went in the request's place (see refuse).
        self.refusals: dict[int, bytes] = {}
        self.records_only = records_only
        self.caps = caps
        self.tracker = CorrelationTracker()
        self.stats = ExchangeStats()
        self._requests = _Requests(self, max_frame_size, records_only)
        self._responses = _Responses(self, max_frame_size, records_only)
        self.requests: Direction = self._requests
        self.responses: Direction = self._responses

    def observe(self) -> None:
        """Hand over every frame once it has passed on (Fed.frames), in parts, with where a
        walk found its record data (a recording cuts them there: it never reads them, nor
        frames the stream again)."""
        self._requests.observe()
        self._responses.observe()

    @property
    def waiting(self) -> int:
        return len(self.tracker)

    def pause_requests(self) -> None:
        """Hold back the client's requests after the one in progress (see _Splitter.pause):
        the tunnel's own frames (a re-authentication) go to the broker in between."""
        self._requests.pause()

    def unpause_requests(self) -> Fed:
        """The requests held back, to pass on now; after them the rest as it comes."""
        return self._requests.unpause()

    @property
    def answered(self) -> bool:
        """Every request that expects an answer has had it, whole: nothing of one is held,
        walked, or still passing."""
        responses = self._responses
        return not self.tracker and not responses.mid_frame and responses._stop is None

    def observe_request(self, header: RequestHeader, wanted: bool) -> None:
        self.stats.requests[header.api_key] = self.stats.requests.get(header.api_key, 0) + 1
        self.tracker.request(header, wanted)

    def seeding(self, header: RequestHeader) -> bool:
        """Whether this request waits for the deployed groups' offsets first (an
        OffsetFetch of an isolating tunnel's --isolate-from-deployed, not asked yet)."""
        isolation = self.isolation
        return (
            header.api_key == OFFSET_FETCH
            and isolation is not None
            and isolation.from_deployed
            and header.correlation_id not in self.seeds
            and header.body_offset is not None
        )

    def deployed_answered(
        self, ask: DeployedAsk, answers: Mapping[str, bytes | None]
    ) -> dict[str, str]:
        """The deployed groups' answers to `ask` (None: not had), for resume() to send the
        request on; the groups whose answer could not be read, and why. A group without
        an answer starts as its client's auto.offset.reset says."""
        seeds, unread = {}, {}
        for group, answer in answers.items():
            if answer is None:
                continue
            try:
                seeds[group] = deployed_offsets(answer, ask.api_version)
            except ProtocolError as error:
                unread[group] = str(error)
        alone = next(iter(ask.requests), None) if ask.api_version < 8 else None
        self.seeds[ask.correlation_id] = (alone, seeds)
        return unread

    def isolated(self, header: RequestHeader, whole: bytes) -> bytes:
        """The request with its ids isolated (itself, without isolation or ids)."""
        if self.isolation is None or header.body_offset is None:
            return whole
        return isolate_request(whole, header.api_key, header.api_version, header.body_offset,
                               self.isolation, self.groups)  # fmt: skip

    def refuse(self, header: RequestHeader, wanted: bool, whole: bytes) -> bytes:
        """A request the policy refuses never reaches the broker. An ApiVersions v0 request
        with its correlation id goes in its place; the broker's answer to that, which comes
        in order after its answers to every earlier request on the connection, is replaced
        by the refusal (built now): the client gets it where Kafka would put its answer,
        and no earlier answer is held for it. A request that expects no answer (a Produce
        with acks=0), or whose refusal cannot be built, ends the connection instead, as
        Kafka's broker ends it on an error it cannot answer: its client then notices."""
        key = header.api_key
        self.stats.refused[key] = self.stats.refused.get(key, 0) + 1
        assert self.policy is not None
        if not wanted:
            raise RefusedUnanswerable(
                f"{_api(key)} with acks=0 refused ({self.policy.reason}): it expects no "
                "answer, so the connection is closed"
            )
        try:
            answer = refused_answer(self.policy, whole, header)
        except Exception as error:  # kio's own errors: a request it cannot read
            raise RefusedUnanswerable(
                f"{_api(key)} v{header.api_version} refused "
                f"({self.policy.reason_for(key)}); its answer cannot be built ({error}), so "
                "the connection is closed"
            ) from None
        self.tracker.request(header, True)  # answered in the broker's answer's place
        self.refusals[header.correlation_id] = answer
        return _stand_in(header.correlation_id)

    def transform_response(self, request: InFlight, whole: bytes) -> tuple[bytes, bytes | None]:
        """The answer as the client gets it and, when isolating changed ids in it, the
        answer with the cluster's ids (and the addresses the client is told): what a
        recording holds, as the requests it holds carry the cluster's ids too."""
        if request.api_key == API_VERSIONS:
            return cap_api_versions(whole, request.api_version, self.caps), None
        key, version = request.api_key, request.api_version
        rewritten = self._addresses_rewritten(key, version, whole)
        if self.isolation is None or response_ids(key, version) is None:
            return rewritten, None
        restored = restore_response(rewritten, key, version, self.isolation)
        seeds = self.seeds.pop(request.correlation_id, None) if key == OFFSET_FETCH else None
        if seeds is not None:  # told the deployed offsets; a recording keeps the cluster's
            restored = seeded_answer(restored, version, *seeds)
        return restored, None if restored is rewritten else rewritten

    def _addresses_rewritten(self, key: int, version: int, whole: bytes) -> bytes:
        if not needs_rewrite(key, version):
            return whole  # held for its ids alone (isolating)
        answers = self.answers
        result, kept_as = None, None
        if answers is not None:
            result, kept_as = answers.find(key, version, whole, self.mapper)
        if result is None:
            result = self._rewrite(
                lambda mapper: rewrite_response(whole, key, version, mapper),
                lambda: addresses_in(whole, key, version),
            )
            if answers is not None and kept_as is not None:
                answers.keep(kept_as, result, self.mapper)
        self.stats.rewritten += result.changed
        return result.frame

    def transform_tail(self, plan: StructPlan, tail: bytes) -> bytes:
        """A walked response's top-level tagged fields, rewritten in as many bytes."""
        out, _ = self._rewrite(
            lambda mapper: rewrite_tail(tail, plan, mapper),
            lambda: addresses_in_tail(tail, plan),
        )
        self.stats.rewritten += out is not tail
        return out

    def _rewrite(
        self, rewrite: Callable[[Mapper], T], named: Callable[[], tuple[BrokerAddress, ...]]
    ) -> T:
        """rewrite(mapper); if the answer names a broker the mapper does not know yet, stop
        with every broker it names (the caller learns them, so new brokers have listeners
        before any client hears of them, and resumes)."""
        try:
            return rewrite(self.mapper)
        except UnknownBroker:
            raise BrokersUnknown(named()) from None

    def observe_error(self, request: InFlight, head: bytes) -> None:
        """Count a coordinator answer's error code (NOT_COORDINATOR among them)."""
        code = top_level_error(head, request.api_key, request.api_version)
        if code:
            self.stats.errors[code] = self.stats.errors.get(code, 0) + 1


def _api(key: int) -> str:
    try:
        return api_title(key)
    except ProtocolError:
        return f"API {key}"


_STAND_IN = struct.Struct(">ihhih")  # size, API key, version, correlation id, client id


def _stand_in(correlation_id: int) -> bytes:
    """What goes to the broker in a refused request's place: ApiVersions v0, which every
    broker answers at any time and which changes nothing."""
    client = b"kafkatunnel-refused"
    size = _STAND_IN.size - SIZE_PREFIX + len(client)
    return _STAND_IN.pack(size, API_VERSIONS, 0, correlation_id, len(client)) + client


class Direction(Protocol):
    """One direction of a connection as the I/O layer drives it: bytes in, what passes on
    (and brokers to learn before it goes on, then resume), how many of the coming bytes
    need not be read at all (skip them once moved), how many a frame held whole awaits.
    Bad bytes raise ProtocolError; taken_before_error() is what passed on before them."""

    def feed(self, data: Chunk) -> Fed: ...
    @property
    def pausing(self) -> bool: ...
    @property
    def paused(self) -> bool: ...
    @property
    def unread(self) -> int: ...
    @property
    def awaited(self) -> int: ...
    def resume(self) -> Fed: ...
    def skip(self, count: int) -> Sequence[FramePassed]: ...
    def taken_before_error(self) -> Fed: ...
    def close(self) -> None: ...


class _Untouched:
    """A direction whose bytes are never read: all of them may pass unread."""

    unread = sys.maxsize
    awaited = 0
    pausing = paused = False

    def feed(self, data: Chunk) -> Fed:
        return Fed([data])

    def resume(self) -> Fed:
        return Fed([])

    def skip(self, count: int) -> Sequence[FramePassed]:
        return ()

    def taken_before_error(self) -> Fed:
        return Fed([])

    def close(self) -> None:
        return None


class PassThrough:
    """The Exchange of transparent mode: bytes pass both ways untouched and unread (TLS and
    SASL stay end to end)."""

    records_only = False  # every byte may pass unread: a recording must read them all

    def __init__(self) -> None:
        self.stats = ExchangeStats()
        self.requests: Direction = _Untouched()
        self.responses: Direction = _Untouched()
