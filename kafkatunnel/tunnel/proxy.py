"""One client connection: the client's socket, its upstream through a forwarder, and the
Exchange that observes requests and rewrites responses in between, moved by two Pumps
(client -> broker, broker -> client). Flow control runs both ways, so a slow client slows
the broker rather than filling memory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence

from kafkatunnel.capture.recorder import Recording
from kafkatunnel.protocol import (
    LOGIN_APIS,
    BrokerAddress,
    DeployedAsk,
    Exchange,
    PassThrough,
    ProtocolError,
    RefusedUnanswerable,
    RequestHeader,
    one_line,
)
from kafkatunnel.tunnel.failure_log import FAILED, FailureLog
from kafkatunnel.tunnel.forwarders import (
    OPEN_DEADLINE,
    Forwarder,
    ForwarderError,
    NoAnswer,
    Upstream,
)
from kafkatunnel.tunnel.registry import Endpoint, Tally
from kafkatunnel.tunnel.relay import ConnectionBug, Pump
from kafkatunnel.tunnel.streams import ByteStream, PlainStream
from kafkatunnel.tunnel.tls import TlsUpstream, accept_tls

log = logging.getLogger("kafkatunnel.proxy")
Address = tuple[str, int]
LINGER = 5.0  # seconds a closing connection may take to deliver what it already read
# Seconds a client that ended its sending (shutdown(SHUT_WR), as `nc -N` does, or a close:
# the tunnel cannot tell them apart) may wait for the answers to what it sent: as long as
# a Kafka client waits for an answer by default (request.timeout.ms).
HALF_CLOSED = 30.0
# Seconds a new connection may wait for the broker's first byte after the client's first:
# every client opens with ApiVersions (or a TLS hello), answered at once by a live broker.
# A silent one (or an upstream closed before any byte) makes the forwarder check its forward,
# also when the client gave up first: an impatient client is no proof the forward works.
FIRST_ANSWER = 3.0
# seconds past --connect-timeout the open is waited for, so that its step that ran out of
# time (a TLS handshake, a login, a token) says so before the open is given up as a whole
STEP_SAYS_WHY = 1.0
# Seconds a re-authentication waits for the answers to what the client sent before its
# requests were held. A broker holds a Fetch up to fetch.max.wait.ms (0.5 s by default), but
# a JoinGroup until the group's rebalance ends, up to the members' max.poll.interval.ms (300
# s by default; Kafka's client waits that and 5 s more): waiting longer costs nothing on the
# broker's side, which takes the login's handshake even after the session ran out, as long
# as no other request came after it.
ANSWERS_BEFORE_LOGIN = 330.0


class ClientConnection:
    def __init__(
        self,
        endpoint: Endpoint,
        forwarder: Forwarder,
        make_exchange: Callable[[Endpoint], Exchange | PassThrough],
        connect_timeout: float,
        on_close: Callable[[ClientConnection], None],
        failures: FailureLog,
        record: Callable[[Endpoint, Address, Address], Recording] | None = None,
        zero_copy: bool = True,
        learn: Callable[[tuple[BrokerAddress, ...]], object] | None = None,
        client_tls: ssl.SSLContext | None = None,
        on_refused: Callable[[ClientConnection, Sequence[RequestHeader]], None] | None = None,
        login: str | None = None,
        ask_deployed: Callable[[DeployedAsk], Awaitable[Mapping[str, bytes | None]]] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.forwarder = forwarder
        self.exchange = make_exchange(endpoint)
        self.connect_timeout = connect_timeout
        self.on_close = on_close
        self.failures = failures  # what went wrong, said once for many alike
        self.record = record
        self.zero_copy = zero_copy
        self.learn = learn  # brokers the answers name, given tunnel addresses
        self.client_tls = client_tls  # serve the client TLS (--client-tls)
        self.on_refused = on_refused  # requests a policy refused (--read-only), to say so
        self.login = login  # who the tunnel logs in as upstream ("alice (SCRAM-SHA-512)")
        self.ask_deployed = ask_deployed  # the deployed groups' offsets (DeployedOffsets)
        self._own_login_told = False  # the client's own SASL login was said
        self.client_tls_session: TlsUpstream | None = None  # with a client of --client-tls
        self.recording: Recording | None = None
        self.sock: socket.socket | None = None
        self.upstream: Upstream | None = None
        self.pumps: list[Pump] = []
        self.peer = "?"
        self._closed = False
        self._ending = False  # the upstream ended; asking it why
        self._heard = False  # the broker sent its first byte
        self._first_answer: asyncio.TimerHandle | None = None  # the deadline for it
        self._half_closed: asyncio.TimerHandle | None = None  # the client ended its sending
        self._answers_check: asyncio.Handle | None = None  # were those the last answers?
        self._renewal: asyncio.TimerHandle | None = None  # the next re-authentication
        self._renewing: asyncio.Task[None] | None = None
        self._quiet: asyncio.Future[None] | None = None  # nothing in flight: log in again
        self._quiet_check: asyncio.Handle | None = None
        self._done = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, sock: socket.socket) -> None:
        """Serve an accepted, non-blocking client socket."""
        self.sock = sock
        try:
            peer = sock.getpeername()
            self.peer = f"{peer[0]}:{peer[1]}"
        except OSError:
            peer = None
        if self.record is not None and peer:
            self.recording = self.record(self.endpoint, peer[:2], sock.getsockname()[:2])
        self.endpoint.connections += 1
        self.endpoint.total_connections += 1
        self._spawn(self._connect())

    def tally(self) -> Tally:
        """What this connection did so far: rewrites, bytes spliced, coordinator errors."""
        stats = self.exchange.stats
        spliced = sum(pump.spliced for pump in self.pumps)
        return Tally(stats.rewritten, spliced, dict(stats.errors), dict(stats.requests),
                     dict(stats.refused))  # fmt: skip

    async def _connect(self) -> None:
        if self.client_tls is not None and not await self._accept_tls(self.client_tls):
            return
        host, port = self.endpoint.advertised_host, self.endpoint.advertised_port
        deadline = asyncio.get_running_loop().time() + self.connect_timeout
        given = OPEN_DEADLINE.set(deadline)
        try:  # the open's steps each say if they ran out of time
            opening = asyncio.ensure_future(self.forwarder.open(host, port))
        finally:
            OPEN_DEADLINE.reset(given)
        try:  # this bound is for a forward that gives no stream at all
            upstream = await asyncio.wait_for(asyncio.shield(opening),
                                              self.connect_timeout + STEP_SAYS_WHY)  # fmt: skip
        except (ForwarderError, TimeoutError, OSError) as error:
            _discard(opening)
            reason = str(error) or f"no stream to {host}:{port} within {self.connect_timeout:g}s"
            if isinstance(error, TimeoutError | NoAnswer):
                self.forwarder.suspect(host, port, reason)  # as a first answer that never came
            self.fail(f"upstream {self.endpoint.advertised}: {reason}")
            return
        except asyncio.CancelledError:  # closed while connecting
            _discard(opening)
            raise
        self.upstream = upstream
        upstream.on_gone = lambda: self._upstream_ended(None)
        assert self.sock is not None
        client: ByteStream = (
            PlainStream(self.sock.fileno(), self.sock.fileno())
            if self.client_tls_session is None
            else self.client_tls_session.stream
        )
        recording = self.recording
        # A recording reads every byte the Exchange does not mark as record data it need not
        # keep; one that keeps payloads (or a PassThrough's opaque bytes) reads them all.
        zero_copy = self.zero_copy and (recording is None or self.exchange.records_only)
        # An Exchange hands a recording whole frames; a PassThrough's bytes are framed by
        # the trace.
        framed, streamed = None, recording
        if recording is not None and isinstance(self.exchange, Exchange):
            self.exchange.observe()
            framed, streamed = recording, None
        self.pumps = [
            Pump(
                client,
                upstream.stream,
                self.exchange.requests,
                zero_copy=zero_copy,
                on_bytes=self._from_client,
                on_source_end=self._client_ended,
                on_sink_error=self._upstream_ended,
                on_chunks=None if streamed is None else streamed.from_client,
                on_frames=None if framed is None else framed.requests,
                on_refused=None if self.on_refused is None else self._refused,
                ask_deployed=None if self.ask_deployed is None else self._ask_deployed,
            ),
            Pump(
                upstream.stream,
                client,
                self.exchange.responses,
                zero_copy=zero_copy,
                on_bytes=self._from_broker,
                on_source_end=self._broker_ended,
                on_sink_error=lambda _: self.close(),  # the client went away
                on_chunks=None if streamed is None else streamed.to_client,
                on_frames=None if framed is None else framed.responses,
                learn=self.learn,
            ),
        ]
        for pump in self.pumps:
            pump.start()
        self._renew_later()

    # -- the broker's session ending (KIP-368) -----------------------------------------------

    def _renew_later(self) -> None:
        """If the broker ends this connection's login after a while, log in again before."""
        assert self.upstream is not None
        renewal = self.upstream.reauthentication
        due = None if renewal is None else renewal.due_in()
        if due is None or self._closed or self._ending or not isinstance(self.exchange, Exchange):
            return
        loop = asyncio.get_running_loop()
        self._renewal = loop.call_later(due, self._renew)

    def _renew(self) -> None:
        self._renewal = None
        if self._closed or self._ending:
            return
        self._renewing = self._spawn(self._reauthenticate())

    async def _reauthenticate(self) -> None:
        """Log in again on the same stream before the broker's session ends, as Kafka's own
        clients do: the client's requests are held after the one in progress, the answers
        to those sent come first, then the tunnel's login goes (its frames never reach the
        client), then the held requests. The client sees a pause, never a closed
        connection."""
        exchange, upstream = self.exchange, self.upstream
        assert isinstance(exchange, Exchange) and upstream is not None
        requests, responses = self.pumps
        exchange.pause_requests()
        self._quiet = asyncio.get_running_loop().create_future()
        self._check_quiet()
        try:
            await asyncio.wait_for(self._quiet, ANSWERS_BEFORE_LOGIN)
        except TimeoutError:
            self.fail(f"upstream {self.endpoint.advertised}: the client's requests in flight "
                      f"were not answered within {ANSWERS_BEFORE_LOGIN:g}s, so the broker's "
                      "session could not be renewed on this connection; it is closed, and "
                      "the client connects again")  # fmt: skip
            return
        finally:
            self._quiet = None
        responses.hold()
        try:  # as long as the first login may take, the last requests' writing included
            await asyncio.wait_for(self._log_in_again(upstream), self.connect_timeout)
        except (ForwarderError, TimeoutError) as error:
            reason = str(error) or f"not done within {self.connect_timeout:g}s"
            self.fail(f"upstream {self.endpoint.advertised}: logging in again: {reason}")
            return
        log.debug("%s: client %s: logged in again", self.endpoint.local, self.peer)
        responses.release()
        requests.go_on(exchange.unpause_requests)
        self._renew_later()

    async def _log_in_again(self, upstream: Upstream) -> None:
        """Once the client's last requests are written: the login, on the same stream."""
        assert upstream.reauthentication is not None
        await self.pumps[0].drained()
        await upstream.reauthentication.again(upstream)

    def _quiet_soon(self) -> None:
        """Check, once the bytes just read have passed through the Exchange, whether the
        connection is quiet for the login."""
        if self._quiet is not None and self._quiet_check is None:
            self._quiet_check = asyncio.get_running_loop().call_soon(self._check_quiet)

    def _check_quiet(self) -> None:
        self._quiet_check = None
        exchange, quiet = self.exchange, self._quiet
        if quiet is None or quiet.done() or not isinstance(exchange, Exchange):
            return
        if exchange.requests.paused and exchange.answered:
            quiet.set_result(None)

    async def _ask_deployed(self, ask: DeployedAsk) -> None:
        """The deployed groups' offsets, handed to the Exchange before its OffsetFetch
        goes on (--isolate-from-deployed)."""
        exchange = self.exchange
        assert self.ask_deployed is not None and isinstance(exchange, Exchange)
        answers = await self.ask_deployed(ask)
        for group, why in exchange.deployed_answered(ask, answers).items():
            log.warning("client %s: the deployed group %r's offsets could not be read (%s): "
                        "its isolated group starts where its auto.offset.reset says",
                        self.peer, one_line(group, 120), one_line(why))  # fmt: skip

    def _refused(self, headers: Sequence[RequestHeader]) -> None:
        assert self.on_refused is not None
        self.on_refused(self, headers)

    def _from_client(self, count: int) -> None:
        self.endpoint.bytes_in += count
        if self._quiet is not None:
            self._quiet_soon()
        if self._first_answer is None and not self._heard:
            signal = f"no answer within {FIRST_ANSWER:g}s on a new connection"
            loop = asyncio.get_running_loop()
            self._first_answer = loop.call_later(FIRST_ANSWER, self._suspect, signal)

    def _from_broker(self, count: int) -> None:
        self.endpoint.bytes_out += count
        if self._quiet is not None:
            self._quiet_soon()
        if self.login is not None and not self._own_login_told:
            self._own_login()
        if not self._heard:
            self._heard = True
            if self._first_answer is not None:
                self._first_answer.cancel()
        if self._half_closed is not None and self._answers_check is None:
            # once these bytes have passed through the Exchange (after this read)
            self._answers_check = asyncio.get_running_loop().call_soon(self._end_if_answered)

    def _own_login(self) -> None:
        """A client of a tunnel that logs in, logging in itself: the tunnel answers its
        SaslHandshake (or SaslAuthenticate) in the broker's place, saying why (see protocol
        own_login); status says it too, once per connection, and the log unless it repeats
        (a client reconnects, and logs in again on each connection)."""
        refused = self.exchange.stats.refused
        if not any(refused.get(key) for key in LOGIN_APIS):
            return
        self._own_login_told = True
        message = (f"client {self.peer} sent a SASL login of its own, which the tunnel answered: "
                   f"the tunnel logs in as {self.login}; the client must not (drop its "
                   "security.protocol and sasl.* settings)")  # fmt: skip
        self._warn(message, "sent a SASL login of their own")

    def _suspect(self, signal: str) -> None:
        """This connection looks as if its forward were dead: let the forwarder check."""
        log.debug("%s: %s", self.endpoint.local, signal)
        self.forwarder.suspect(self.endpoint.advertised_host, self.endpoint.advertised_port,
                               signal)  # fmt: skip

    def _client_ended(self, cause: BaseException | None) -> None:
        if isinstance(cause, ConnectionBug):
            self.fail(f"client {self.peer}: {cause}")
        elif isinstance(cause, RefusedUnanswerable):  # Kafka's broker ends it so, too
            log.info("%s: client %s: %s", self.endpoint.local, self.peer, cause)
            self._client_done()  # after the answers to what came before it
        elif isinstance(cause, ProtocolError):
            self.fail(f"client {self.peer} sent invalid Kafka protocol: {cause}")
        elif cause is None:
            self._client_done()
        else:
            self.close()  # it reset its connection: its own business

    def _client_done(self) -> None:
        """The client ended its sending: perhaps only that (shutdown(SHUT_WR), then it reads
        the answers, as `nc -N` and scripts do), perhaps all (a close looks the same). What
        it sent still goes to the broker, and the answers to it come back: the connection
        ends once the last is read, the broker ends it, writing to the client fails, or
        HALF_CLOSED passes. In transparent mode the bytes are opaque: it ends now."""
        if self._closed:
            return
        if not isinstance(self.exchange, Exchange) or self.exchange.answered:
            self.close()
            return
        loop = asyncio.get_running_loop()
        self._half_closed = loop.call_later(HALF_CLOSED, self._answers_late)

    def _end_if_answered(self) -> None:
        self._answers_check = None
        if isinstance(self.exchange, Exchange) and self.exchange.answered:
            self.close()

    def _answers_late(self) -> None:
        log.debug("%s: client %s ended its sending; its answers did not come within %gs",
                  self.endpoint.local, self.peer, HALF_CLOSED)  # fmt: skip
        self.close()

    def _broker_ended(self, cause: BaseException | None) -> None:
        if isinstance(cause, ConnectionBug):
            self.fail(f"broker {self.endpoint.advertised}: {cause}")
        elif isinstance(cause, ProtocolError):
            self.fail(f"broker {self.endpoint.advertised} answered with invalid Kafka: {cause}")
        else:
            self._upstream_ended(cause if isinstance(cause, OSError) else None)

    def _upstream_ended(self, error: OSError | None) -> None:
        """Ask the upstream why (an exec forward's exit status), then close."""
        if self._ending or self._closed:
            return
        self._ending = True
        if not self._heard:
            self._suspect("a connection closed before any answer")
        for pump in self.pumps:
            pump.stop()
        self._spawn(self._explain(error))

    async def _explain(self, error: OSError | None) -> None:
        assert self.upstream is not None
        reason = await self.upstream.why_ended(error)
        if reason:
            self.fail(f"upstream {self.endpoint.advertised}: {reason}")
        else:
            self.close()

    # -- ending -----------------------------------------------------------------------------

    async def _accept_tls(self, context: ssl.SSLContext) -> bool:
        """The client's TLS handshake; False (the connection failed, saying why) if none."""
        assert self.sock is not None
        try:
            self.client_tls_session = await asyncio.wait_for(
                accept_tls(self.sock, context), self.connect_timeout
            )
        except (ssl.SSLError, ForwarderError, OSError, TimeoutError) as error:
            reason = str(error) or f"no TLS handshake within {self.connect_timeout:g}s"
            self.fail(
                f"client {self.peer}: TLS: {reason} (--client-tls: clients use "
                "security.protocol=SSL with the ssl.ca.location printed at start)"
            )
            return False
        return True

    def fail(self, message: str) -> None:
        """Close this connection only, recording why."""
        if not self._closed:
            self._warn(message)
        self.close()

    def _warn(self, message: str, repeated: str = FAILED) -> None:
        """Status records each; the log says it unless other connections of this listener
        said the same just before (FailureLog)."""
        self.endpoint.record_error(message)
        self.failures.warn(self.endpoint.local, message, self.peer, repeated)

    def close(self) -> None:
        """Read no more; deliver what was already read (up to LINGER), then let go."""
        if self._closed:
            return
        self._closed = True
        self.endpoint.connections -= 1
        for handle in (self._half_closed, self._answers_check, self._renewal,
                       self._quiet_check):  # fmt: skip
            if handle is not None:
                handle.cancel()
        if self._renewing is not None:
            self._renewing.cancel()  # what it read of the login goes nowhere now
        if self.recording is not None:
            self.recording.closed()
        for pump in self.pumps:
            pump.stop()
        if self.upstream is None:  # still connecting: no more of that
            for task in list(self._tasks):
                task.cancel()
        self._spawn(self._finish())

    async def _finish(self) -> None:
        if any(pump.pending for pump in self.pumps):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*(pump.drained() for pump in self.pumps)), LINGER
                )
        for pump in self.pumps:
            pump.close()
        if self.client_tls_session is not None:
            self.client_tls_session.close()  # close_notify: the client sees a clean end
            self.client_tls_session.release()
        if self.sock is not None:
            self.sock.close()
        if self.upstream is not None:
            self.upstream.end()  # what was written to it still goes on
            self.upstream.release()
        self._done.set()
        self.on_close(self)

    async def wait_closed(self) -> None:
        """Until the connection has let go of its client and its upstream."""
        await self._done.wait()

    def _spawn(self, work: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._ended_if_broken(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # a task cancelled before it first ran never awaited `work`: close it, or Python
        # warns of a coroutine never awaited (closing one that ran is a no-op)
        task.add_done_callback(lambda _: work.close())
        return task

    async def _ended_if_broken(self, work: Coroutine[object, object, None]) -> None:
        """Run this connection's work; an error nothing should cause ends this connection,
        saying so, instead of leaving it open and counted with no task serving it."""
        try:
            await work
        except Exception as error:  # one connection's bug must not linger
            log.debug("%s: client %s", self.endpoint.local, self.peer, exc_info=True)
            self.fail(str(ConnectionBug(error)))


def _discard(opening: asyncio.Future[Upstream]) -> None:
    """Close the stream an abandoned open gives, now or whenever it comes."""

    def discard(done: asyncio.Future[Upstream]) -> None:
        if not done.cancelled() and done.exception() is None:
            upstream = done.result()
            upstream.close()
            upstream.release()

    opening.add_done_callback(discard)
