"""How one direction of the relay ends when its source breaks the protocol: what came whole
before the bad bytes is still written, then the owner hears why. Pumps over socketpairs, on
both event loops, spliced and copied, with a real Exchange and the registry's learning."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from kafkatunnel.protocol import (
    Direction,
    Exchange,
    FramePassed,
    ProtocolError,
    frame,
    rewrite_caps,
)
from kafkatunnel.tunnel.relay import ZERO_COPY, ConnectionBug, Pump
from kafkatunnel.tunnel.streams import PlainStream
from tests.kio_messages import fetch_request, response_frame
from tests.protocol.test_streaming import FETCH, _answer_with_endpoint, _records_start
from tests.tunnel.test_learning import Learner, ask, fed, metadata_answer

pytestmark = pytest.mark.quick

T = TypeVar("T")
# Bad bytes after a whole answer: a frame of negative size, or an answer to no request.
BROKEN = {
    "negative-size": b"\xff\xff\xff\xff" + b"not Kafka",
    "unasked": frame((99).to_bytes(4, "big") + bytes(8)),
}
KNOWN = {0: "kafka-0.kafka"}  # brokers the first answer names (learned before, or not)

LOOPS = pytest.mark.parametrize("uvloop", [False, True], ids=["asyncio", "uvloop"])
COPIES = pytest.mark.parametrize(
    "zero_copy",
    [pytest.param(True, marks=pytest.mark.skipif(not ZERO_COPY, reason="Linux")), False],
    ids=["splice", "copy"],
)


def run(main: Coroutine[Any, Any, T], uvloop: bool) -> T:
    if uvloop:
        import uvloop as uv

        return uv.run(main)
    return asyncio.run(main)


@dataclass
class Piped:
    """A Pump between two socket pairs: the test writes into `feeding` (its source's other
    end) and reads `received` (its sink's); `ended` says why the Pump ended."""

    pump: Pump
    feeding: socket.socket
    received: socket.socket
    ended: asyncio.Future[BaseException | None]


@contextlib.contextmanager
def piped(
    direction: Direction,
    zero_copy: bool,
    on_bytes: Callable[[int], None] = lambda _: None,
    **options: Any,
) -> Iterator[Piped]:
    """A Pump of `direction` over socket pairs (`options`: the Pump's other callbacks); it
    and every socket but `received` (for `everything`) are closed after."""
    source, feeding = socket.socketpair()
    sink, received = socket.socketpair()
    source.setblocking(False)
    sink.setblocking(False)
    ended: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def end(cause: BaseException | None) -> None:
        if not ended.done():
            ended.set_result(cause)

    pump = Pump(
        PlainStream(source.fileno(), source.fileno()),
        PlainStream(sink.fileno(), sink.fileno()),
        direction,
        zero_copy=zero_copy,
        on_bytes=on_bytes,
        on_source_end=end,
        on_sink_error=end,
        **options,
    )
    try:
        yield Piped(pump, feeding, received, ended)
    finally:
        pump.close()
        for side in (sink, source, feeding):
            side.close()


async def through_pump(
    exchange: Exchange,
    data: bytes,
    zero_copy: bool,
    learn: Callable[[Any], object] | None = None,
    frames: list[FramePassed] | None = None,
) -> tuple[bytes, BaseException | None]:
    """Write `data` at once into an answers' Pump's source; what its sink got once the Pump
    ended, and why it ended."""
    observe: Callable[[Sequence[FramePassed]], None] | None = None
    if frames is not None:
        observe = frames.extend
    with piped(exchange.responses, zero_copy, on_frames=observe, learn=learn) as rig:
        rig.feeding.sendall(data)  # one write: the Pump reads it in one read
        rig.pump.start()
        cause = await asyncio.wait_for(rig.ended, 10)
        await asyncio.wait_for(rig.pump.drained(), 10)
    return everything(rig.received), cause


def everything(received: socket.socket) -> bytes:
    """What a sink's other end got, once the sink is closed."""
    received.settimeout(10)
    got = b""
    while chunk := received.recv(1 << 16):
        got += chunk
    received.close()
    return got


def rewritten(answer: bytes, correlation_id: int) -> bytes:
    """The answer as the client must get it (a fresh Exchange and registry of its own)."""
    learner = Learner()
    exchange = Exchange(learner.registry.map, rewrite_caps())
    exchange.requests.feed(ask(correlation_id))
    return fed(exchange, answer, learner)


@LOOPS
@COPIES
@pytest.mark.parametrize("learned", [True, False], ids=["known-brokers", "new-brokers"])
@pytest.mark.parametrize("observed", [False, True], ids=["plain", "recorded"])
@pytest.mark.parametrize("broken", BROKEN)
def test_a_whole_answer_ahead_of_a_broken_one_is_delivered_then_the_pump_ends(
    uvloop: bool, zero_copy: bool, learned: bool, observed: bool, broken: str
) -> None:
    """The answer and the bad bytes arrive in one read: the answer (rewritten; its brokers
    learned first when new) reaches the client, a recording sees it pass, and the Pump
    ends saying the protocol broke."""
    answer = metadata_answer(1, KNOWN)
    learner = Learner()
    if learned:
        learner.learn(tuple(_named(answer)))
    exchange = Exchange(learner.registry.map, rewrite_caps())
    if observed:
        exchange.observe()
    exchange.requests.feed(ask(1))
    exchange.requests.feed(ask(2))  # the broken bytes stand where its answer would
    frames: list[FramePassed] | None = [] if observed else None

    got, cause = run(
        through_pump(exchange, answer + BROKEN[broken], zero_copy, learner.learn, frames), uvloop
    )

    assert isinstance(cause, ProtocolError), cause
    assert got == rewritten(answer, 1)
    assert b"kafka-0.kafka" not in got
    if frames is not None:
        assert len(frames) == 1 and b"".join(map(bytes, frames[0].parts)) == got


def _named(answer: bytes) -> list[Any]:
    from kafkatunnel.protocol import addresses_in

    return list(addresses_in(answer, 3, 12))


@LOOPS
@COPIES
def test_records_that_end_a_frame_its_walk_needs_more_of_are_bad_input_not_a_bug(
    uvloop: bool, zero_copy: bool
) -> None:
    """A Fetch answer that names brokers is walked to its tagged fields; one whose frame
    ends with its records is the broker's bad answer (the Pump says so, like any other),
    whether the records were spliced or read, and what passed before is delivered."""
    whole = response_frame(FETCH, 16, _encode_answer(64 << 10), 7)
    end = _records_start(whole) + (64 << 10)  # just past the records
    cut = frame(whole[4:end])
    exchange = Exchange(lambda address: ("127.0.0.1", 19093), rewrite_caps())
    exchange.requests.feed(fetch_request(16, 7))

    got, cause = run(through_pump(exchange, cut, zero_copy), uvloop)

    assert isinstance(cause, ProtocolError) and not isinstance(cause, ConnectionBug), cause
    assert got == (cut if zero_copy else cut[: len(got)])  # spliced: all of it had passed
    if not zero_copy:  # read: what the protocol layer said passed before the bad bytes
        alone = Exchange(lambda address: ("127.0.0.1", 19093), rewrite_caps())
        alone.requests.feed(fetch_request(16, 7))
        with pytest.raises(ProtocolError):
            alone.responses.feed(cut)
        assert got == b"".join(alone.responses.taken_before_error().out) != b""


def _encode_answer(records: int) -> bytes:
    from tests.kio_messages import encode

    return encode(_answer_with_endpoint("kafka-0.kafka-headless.ns.svc.cluster.local", records))


@LOOPS
@COPIES
def test_bad_bytes_held_back_by_a_pause_end_the_pump_after_the_request_ahead_of_them(
    uvloop: bool, zero_copy: bool
) -> None:
    """A pause (the tunnel logging in again) begins in the middle of a request; the read
    that ends it brings a whole request and bad bytes, held back. On going on, the request
    held ahead of the bad bytes is still written, then the Pump ends saying the protocol
    broke, as for bad bytes read at any other time."""
    first, second = ask(1), ask(2)

    async def main() -> tuple[bytes, BaseException | None, bool]:
        read = asyncio.Event()
        exchange = Exchange(Learner().registry.map, rewrite_caps())

        async def until(condition: Callable[[], bool]) -> None:
            while not condition():
                read.clear()
                await asyncio.wait_for(read.wait(), 10)

        with piped(exchange.requests, zero_copy, on_bytes=lambda _: read.set()) as rig:
            rig.feeding.sendall(first[:5])
            rig.pump.start()
            await asyncio.wait_for(read.wait(), 10)  # the first bytes are read
            exchange.pause_requests()
            rig.feeding.sendall(first[5:] + second + BROKEN["negative-size"])
            await until(lambda: exchange.requests.paused)
            held = not rig.ended.done()
            rig.pump.go_on(exchange.unpause_requests)
            cause = await asyncio.wait_for(rig.ended, 10)
            await asyncio.wait_for(rig.pump.drained(), 10)
        return everything(rig.received), cause, held

    got, cause, held = run(main(), uvloop)
    assert held  # nothing after the first request was read until going on
    assert isinstance(cause, ProtocolError), cause
    assert got == first + second


@LOOPS
@COPIES
def test_a_paused_direction_is_not_read_until_it_goes_on(uvloop: bool, zero_copy: bool) -> None:
    """Paused between requests (the tunnel logging in again), the Pump reads no more of its
    source: what the client sends meanwhile stays in the socket, however much it sends, and
    passes on once the direction goes on. Whether the Pump read is asked of the loop: a
    probe made readable after the client's bytes is heard in the same poll."""
    first, second = ask(1), ask(2)

    async def main() -> tuple[int, int, bytes]:
        probe, probing = socket.socketpair()
        probe.setblocking(False)
        loop = asyncio.get_running_loop()
        read = asyncio.Event()
        total = 0
        exchange = Exchange(Learner().registry.map, rewrite_caps())

        def counted(count: int) -> None:
            nonlocal total
            total += count
            read.set()

        probed: asyncio.Future[None] = loop.create_future()

        def heard() -> None:
            if not probed.done():
                probed.set_result(None)

        with piped(exchange.requests, zero_copy, on_bytes=counted) as rig, probe, probing:
            rig.pump.start()
            rig.feeding.sendall(first)
            while total < len(first):
                read.clear()
                await asyncio.wait_for(read.wait(), 10)
            exchange.pause_requests()  # between requests: paused at once
            rig.feeding.sendall(second)
            loop.add_reader(probe.fileno(), heard)
            probing.sendall(b"?")
            await asyncio.wait_for(probed, 10)  # the poll that saw `second` has run
            loop.remove_reader(probe.fileno())
            while_paused = total
            rig.pump.go_on(exchange.unpause_requests)
            while total < len(first) + len(second):
                read.clear()
                await asyncio.wait_for(read.wait(), 10)
            await asyncio.wait_for(rig.pump.drained(), 10)
            after = total
        return while_paused, after, everything(rig.received)

    while_paused, after, got = run(main(), uvloop)
    assert while_paused == len(first)  # `second` was left in the socket
    assert after == len(first) + len(second)
    assert got == first + second
