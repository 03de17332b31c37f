"""Whether the bootstrap broker answers through the forwarder, and if not, why.

`up` asks this before it prints `bootstrap.servers=...`: a tunnel that can reach nothing
must say so at once, with the forwarder's own cause (the exec command's exit status and
stderr, the refused address, the kubectl error), instead of serving and letting the first
client find out. The question is an ApiVersions request, which every broker answers before
any authentication. In transparent mode the brokers may speak TLS: any reply, or a close
that the forwarder does not blame on itself, counts as reached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kafkatunnel.probe import api_versions_request
from kafkatunnel.protocol import FrameDecoder, ProtocolError
from kafkatunnel.tunnel.forwarders import Forwarder, ForwarderError, Upstream
from kafkatunnel.tunnel.login import LoginRefused
from kafkatunnel.tunnel.oauth_token import TokenError
from kafkatunnel.tunnel.tls import speaks_tls

RETRY_PAUSE = 0.5  # between attempts: a kubectl forward or a VPN may need a moment


class Unreachable(Exception):
    """The bootstrap broker did not answer in time; the message is the last cause seen.

    `refused`: the forwarder was refused for good (RBAC), so no time was spent waiting;
    `login`: what refused was the broker, to the tunnel's login (the cause says why)."""

    def __init__(self, cause: str, *, refused: bool = False, login: bool = False) -> None:
        super().__init__(cause)
        self.refused = refused
        self.login = login


async def reach(
    forwarder: Forwarder,
    host: str,
    port: int,
    timeout: float,
    tls_possible: bool = False,
    on_retry: Callable[[str], None] | None = None,
) -> None:
    """Return once host:port answers through `forwarder`; raise Unreachable after `timeout`
    seconds of attempts, naming the last cause."""
    deadline = time.monotonic() + timeout
    cause = "no answer"
    attempts = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Unreachable(cause)
        attempts += 1
        try:
            await asyncio.wait_for(_ask(forwarder, host, port, tls_possible), remaining)
            return
        except TimeoutError:
            cause = cause if attempts > 1 else f"no answer within {timeout:g}s"
            raise Unreachable(cause) from None
        except ForwarderError as error:
            if error.permanent:
                login = isinstance(error, LoginRefused | TokenError)
                raise Unreachable(str(error), refused=True, login=login) from None
            cause = str(error)
        except (ConnectionError, OSError, ProtocolError) as error:
            cause = str(error) or type(error).__name__
        if on_retry is not None and attempts == 1:
            on_retry(cause)
        await asyncio.sleep(min(RETRY_PAUSE, max(0.0, deadline - time.monotonic())))


class _Unanswered(ConnectionError):
    """Closed without a byte of answer, the forwarder blaming nothing: perhaps TLS."""


TLS_RECORD_STARTS = (b"\x15\x03", b"\x16\x03")  # an alert, a handshake (RFC 8446 5.1)
SPEAKS_TLS = "this listener speaks TLS: add --tls (and --tls-ca FILE)"


async def _ask(forwarder: Forwarder, host: str, port: int, tls_possible: bool) -> None:
    upstream = await forwarder.open(host, port)
    try:
        await _answered(upstream, tls_possible)
    except _Unanswered:
        if await speaks_tls(forwarder, host, port):
            raise ForwarderError(f"{host}:{port}: {SPEAKS_TLS}", permanent=True) from None
        raise
    finally:
        await upstream.discard()


async def _answered(upstream: Upstream, tls_possible: bool) -> None:
    try:
        await upstream.send(api_versions_request())
    except OSError as error:  # a process that exited at once: its status says why
        raise await _failed(upstream, error) from None
    decoder = FrameDecoder(max_frame_size=1 << 20)
    while True:
        try:
            data = await upstream.receive()
        except OSError as error:  # a TLS alert, read over a socket, is one too
            raise await _failed(upstream, error) from None
        if not data:
            reason = await upstream.why_ended(None)
            if reason is not None and upstream.refused:
                raise ForwarderError(reason, permanent=True)
            if reason is None and tls_possible:
                return  # a TLS listener hangs up on plaintext: something is there
            if reason is not None:
                raise ConnectionError(reason)
            raise _Unanswered(
                "the broker closed the connection without answering: is this address a "
                "Kafka listener?"
            )
        if tls_possible:
            return
        if data.startswith(TLS_RECORD_STARTS):
            raise ForwarderError(SPEAKS_TLS, permanent=True)
        if decoder.feed(data):
            return


async def _failed(upstream: Upstream, error: OSError) -> Exception:
    """Why reading or writing the upstream failed: for good if the far end refused us."""
    reason = await upstream.why_ended(error) or str(error)
    if upstream.refused:
        return ForwarderError(reason, permanent=True)
    return ConnectionError(reason)
