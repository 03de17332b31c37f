"""The bearer token the tunnel logs in with (OAUTHBEARER): fetched from the identity
provider's token endpoint with the client credentials grant (RFC 6749 4.4), once, shared
by every connection, and fetched again when 80% of its lifetime has passed (Kafka's
client's default refresh window, sasl.login.refresh.window.factor), before it expires.

The request and the reading of the answer are pure functions (`token_request`,
`read_token_answer`); `TokenSource` is the thin I/O on top: urllib in a thread, no
redirect followed, no proxy from the environment (the grant carries the client secret),
the answer read up to a bound and waited for at most a bound: at start the user's start
timeout, then REQUEST_TIMEOUT per request (an endpoint that takes the connection and never
answers holds no login longer). The endpoint's answer is input like any other: its size is
bounded, its fields checked, every answer is a token or a TokenError saying why, and what
it says when it refuses (RFC 6749 5.2's `error` and `error_description`) is shown as
printable text, cut short, with the client secret blanked should it echo it.

Once the tunnel runs, a refresh that fails (or is not answered within REQUEST_TIMEOUT, or
fails in a way no answer should: a bug, said as one) is asked again every RETRY_PAUSE
seconds, and the token held is used until it ends; after that, logins fail with what the
endpoint said last (asked again at most every RETRY_PAUSE seconds, however many
connections open).

Neither the token nor the client secret is ever in a repr, a message, a log or status:
status has the token's expiry and subject only."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import http.client
import json
import logging
import math
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from kafkatunnel.protocol import one_line
from kafkatunnel.tunnel.forwarders import ForwarderError

log = logging.getLogger(__name__)

REFRESH_WINDOW = 0.8  # Kafka's sasl.login.refresh.window.factor default
MAX_ANSWER = 256 * 1024  # a token answer is a few KiB; more is not one
MAX_LIFETIME = 366 * 24 * 3600.0  # seconds; a longer one is not believed
# seconds; a shorter one would have the endpoint asked again and again (Kafka's client
# does not refresh more often than sasl.login.refresh.min.period.seconds either)
MIN_LIFETIME = 1.0
# seconds a request to the endpoint is waited for once the tunnel runs (at start: the start
# timeout, this one when it is 0)
REQUEST_TIMEOUT = 15.0
RETRY_PAUSE = 5.0  # seconds between attempts when a refresh fails
STUCK_AFTER = 4  # request bounds after which a request still running is not waited on again
# A token is not sent in the last second of its lifetime: `expires_in` and a JWT's `exp`
# are whole seconds from when it was issued (Keycloak's), and a broker that gets a token
# past its `exp` (within its clock skew) gives a session that never ends.
LAST_SECOND = 1.0
# RFC 6750's b64token: what a bearer token may hold
BEARER_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
MAX_TOKEN = 64 * 1024


class TokenError(ForwarderError):
    """No token: the endpoint refused the client, or its answer cannot be used. The
    message names the client id and the endpoint, and what the endpoint said."""


class NoAnswer(TokenError):
    """The endpoint took the connection and did not answer in time."""


@dataclass(frozen=True)
class Token:
    """A bearer token and what the tunnel knows of it. `lifetime`: seconds from
    `asked_at` (the tunnel's clock, when it asked for it: the token was issued after), which
    say when it is refreshed and when no longer sent; `expires_at`: when it ends as the
    endpoint's clock says (the JWT's `exp` when it has one), for status; `subject`: the
    JWT's `sub` (None: not a JWT, or none said)."""

    value: str = field(repr=False)
    lifetime: float
    asked_at: float
    expires_at: float
    subject: str | None = None

    @property
    def ends_at(self) -> float:
        """When it is no longer sent (the tunnel's clock): its last second (a tenth of a
        short lifetime) is not used."""
        return self.asked_at + self.lifetime - min(LAST_SECOND, self.lifetime / 10)

    def ended(self, now: float) -> bool:
        return now >= self.ends_at


@dataclass(frozen=True)
class TokenEndpoint:
    """Where and as whom the tunnel asks for tokens. The client secret is held in memory
    only and never shown; `source` says where it came from (--sasl-client-secret-file F)."""

    url: str
    client_id: str
    client_secret: bytes = field(repr=False)
    scope: str | None = None
    ca: Path | None = None  # the CA that signs an https endpoint (None: the system's)
    source: str = ""

    def describe(self) -> str:
        return f"client {self.client_id} at {self.url}"


def token_request(endpoint: TokenEndpoint) -> tuple[bytes, dict[str, str]]:
    """The client credentials grant's body and headers: the client authenticated with
    HTTP Basic (RFC 6749 2.3.1, each part form-encoded), as Kafka's client sends it."""
    form = {"grant_type": "client_credentials"}
    if endpoint.scope:
        form["scope"] = endpoint.scope
    user = urllib.parse.quote_plus(endpoint.client_id).encode()
    secret = urllib.parse.quote_plus(endpoint.client_secret).encode()
    basic = base64.b64encode(user + b":" + secret).decode()
    headers = {
        "Authorization": f"Basic {basic}",
        "Content-Type": "application/x-www-form-urlencoded",
        "Accept": "application/json",
    }
    return urllib.parse.urlencode(form).encode(), headers


def read_token_answer(endpoint: TokenEndpoint, status: int, body: bytes, now: float) -> Token:
    """The token in the endpoint's answer (HTTP `status`, `body`) to a request sent at
    wall-clock `now`; TokenError naming the client, the endpoint and what it said otherwise."""
    whom = endpoint.describe()
    if len(body) > MAX_ANSWER:
        size = f"{MAX_ANSWER // 1024} KiB"
        raise TokenError(f"the token endpoint's answer to {whom} is over {size}: not a "
                         "token answer", permanent=True)  # fmt: skip
    try:
        answer = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        answer = None
    if not isinstance(answer, dict):
        raise TokenError(f"the token endpoint answered {whom} with HTTP {status} and no "
                         "OAuth JSON object: is the URL the token endpoint?",
                         permanent=True)  # fmt: skip
    if status != 200 or "error" in answer:
        said = _printable(answer.get("error"), endpoint) or "no error code"
        description = _printable(answer.get("error_description"), endpoint)
        if description:
            said += f": {description}"
        raise TokenError(f"the token endpoint refused {whom} (HTTP {status}): {said}"
                         f"{_fix(answer.get('error'), endpoint)}", permanent=True)  # fmt: skip
    value = answer.get("access_token")
    if not (isinstance(value, str) and len(value) <= MAX_TOKEN and BEARER_TOKEN.fullmatch(value)):
        raise TokenError(f"the token endpoint's answer to {whom} holds no bearer token "
                         "(access_token)", permanent=True)  # fmt: skip
    kind = answer.get("token_type")
    if not isinstance(kind, str) or kind.lower() != "bearer":
        shown = _printable(kind, endpoint) or "none"
        raise TokenError(f"the token endpoint gave {whom} a token of type {shown}, not "
                         "Bearer", permanent=True)  # fmt: skip
    claims = jwt_claims(value)
    expires_in = _seconds(answer.get("expires_in"))
    exp, iat, subject = _seconds(claims.get("exp")), _seconds(claims.get("iat")), claims.get("sub")
    if expires_in is not None:
        lifetime = expires_in
    elif exp is not None:
        lifetime = exp - (now if iat is None else iat)
    else:
        raise TokenError(f"the token endpoint's answer to {whom} says no lifetime (no "
                         "expires_in, and the token has no exp)", permanent=True)  # fmt: skip
    if not MIN_LIFETIME <= lifetime <= MAX_LIFETIME:
        said = f"{lifetime:g} s" if math.isfinite(lifetime) else "past any clock"
        raise TokenError(f"the token endpoint gave {whom} a token whose lifetime is {said}: "
                         f"not believed (from {MIN_LIFETIME:g} s to a year is)",
                         permanent=True)  # fmt: skip
    # for status: the JWT's own end, if it is one a clock can show
    believable = exp is not None and now - MAX_LIFETIME <= exp <= now + MAX_LIFETIME
    expires_at = exp if believable and exp is not None else now + lifetime
    shown_subject = subject if isinstance(subject, str) and subject.isprintable() else None
    return Token(value, lifetime, now, expires_at, shown_subject and one_line(shown_subject))


def jwt_claims(token: str) -> dict[str, object]:
    """A JWT's claims, unverified (the tunnel only reads when it expires and whom it names:
    the broker is the one that checks it); {} for a token that is not a JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = json.loads(payload)
    except (binascii.Error, ValueError, RecursionError):
        return {}
    return claims if isinstance(claims, dict) else {}


def _seconds(value: object) -> float | None:
    """A JSON number of seconds as a float, infinite past a float's range (JSON numbers
    have none: Python reads 1e400 as inf, 10**400 as an int no float holds); None for
    anything else (NaN, true, "60")."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    return None if math.isnan(value) else value


def _printable(value: object, endpoint: TokenEndpoint) -> str:
    """What the endpoint said, as one line of printable text, cut short, the client secret
    blanked first (an endpoint that echoes it must not make the tunnel show any of it)."""
    if not isinstance(value, str):
        return ""
    for form in secret_forms(endpoint):
        value = value.replace(form, "***")
    return one_line(value)


def secret_forms(endpoint: TokenEndpoint) -> tuple[str, ...]:
    """Every form in which the request carries the client secret, or an endpoint may say
    it back: as given, form-encoded, in base64, and the whole Basic credential."""
    if not endpoint.client_secret:
        return ()
    secret = endpoint.client_secret.decode("utf-8", "replace")
    basic = token_request(endpoint)[1]["Authorization"].removeprefix("Basic ")
    alone = base64.b64encode(endpoint.client_secret).decode().rstrip("=")
    forms = {secret, urllib.parse.quote_plus(secret), urllib.parse.quote(secret), basic, alone}
    return tuple(sorted(forms, key=len, reverse=True))  # the longest first: it holds others


def _fix(error: object, endpoint: TokenEndpoint) -> str:
    if error in ("invalid_client", "unauthorized_client"):
        return (f"; check the client id and the secret ({endpoint.source or 'as given'}), "
                "and that the client may use the client credentials grant")  # fmt: skip
    if error == "invalid_scope":
        return "; check --sasl-scope"
    return ""


# a request to the endpoint, its every wait bounded by the seconds given: (status, body)
Fetch = Callable[[TokenEndpoint, float], tuple[int, bytes]]


def http_fetch(endpoint: TokenEndpoint, within: float) -> tuple[int, bytes]:
    """POST the grant to the endpoint (blocking: run it in a thread); the HTTP status and
    at most MAX_ANSWER + 1 bytes of the body. TokenError when the endpoint cannot be
    reached (naming it, never the request); NoAnswer when a wait (to connect, for a byte
    of the answer) lasts `within` seconds."""
    body, headers = token_request(endpoint)
    request = urllib.request.Request(endpoint.url, data=body, headers=headers, method="POST")
    context = None
    if endpoint.url.startswith("https:"):
        try:
            context = ssl.create_default_context(
                cafile=None if endpoint.ca is None else str(endpoint.ca)
            )
        except (OSError, ssl.SSLError) as cause:
            raise TokenError(f"--sasl-token-endpoint-ca {endpoint.ca}: {cause}",
                             permanent=True) from None  # fmt: skip
    # no proxy from the environment (http_proxy, https_proxy, all_proxy): the grant would
    # show it the client secret, and an http one every token
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), _NoRedirect, urllib.request.HTTPSHandler(context=context)
    )
    try:
        try:
            answer = opener.open(request, timeout=within)
        except urllib.error.HTTPError as refusal:  # an answer too: its body says why
            answer = refusal
        with contextlib.closing(answer):  # the body is read where its failures are caught
            return int(answer.status), answer.read(MAX_ANSWER + 1)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as cause:
        reason = getattr(cause, "reason", None) or cause
        if isinstance(reason, TimeoutError):
            raise NoAnswer(unanswered(endpoint, within, "")) from None
        said = unreached(reason, endpoint)
        raise TokenError(f"cannot reach the token endpoint {endpoint.url} for client "
                         f"{endpoint.client_id}: {said}") from None  # fmt: skip


def unreached(reason: object, endpoint: TokenEndpoint) -> str:
    """Why the endpoint could not be asked, in words, and what to check."""
    host = urllib.parse.urlsplit(endpoint.url).hostname or endpoint.url
    check = "; check --sasl-token-endpoint"
    running = f"{check} and that the identity provider runs"
    if isinstance(reason, ConnectionRefusedError):
        return f"connection refused (nothing listens there){running}"
    if isinstance(reason, socket.gaierror):
        said = (reason.strerror or str(reason)).lower()
        return f"the name {host} is not resolved ({said}){check}"
    if isinstance(reason, ssl.SSLCertVerificationError):
        said = reason.verify_message or str(reason)
        if reason.verify_code in (X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH):
            return (f"its certificate is not for {host} ({said}); name the endpoint in "
                    "--sasl-token-endpoint as its certificate does")  # fmt: skip
        return f"its certificate is not trusted ({said}); give its CA with --sasl-token-endpoint-ca"
    if isinstance(reason, ssl.SSLError) and reason.reason == "WRONG_VERSION_NUMBER":
        # OpenSSL's word for an answer to its hello that is no TLS record: plain HTTP
        return (f"what answers there does not speak TLS; an endpoint serving plain HTTP takes "
                f"an http:// URL{check} and its port")  # fmt: skip
    if isinstance(reason, http.client.HTTPException):  # something else listens there
        said = one_line(str(reason), 80) or type(reason).__name__
        return f"what answers there does not speak HTTP ({said}){check} and its port"
    said = getattr(reason, "strerror", None) or one_line(str(reason)) or type(reason).__name__
    return f"{said}{check}"


# OpenSSL's verify codes for a certificate valid but for another name (x509_vfy.h)
X509_V_ERR_HOSTNAME_MISMATCH = 62
X509_V_ERR_IP_ADDRESS_MISMATCH = 64


def unanswered(endpoint: TokenEndpoint, within: float, fix: str) -> str:
    """An endpoint that took the connection and said nothing for `within` seconds: what
    to check, and `fix` (how to give it longer)."""
    return (f"the token endpoint {endpoint.url} did not answer client {endpoint.client_id} "
            f"within {within:g} s; check --sasl-token-endpoint, that the identity provider "
            f"runs and the network to it{fix}")  # fmt: skip


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as it is: the grant (and the secret) go to the URL given."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


class TokenSource:
    """The current token for every login: fetched at start (`fetch_first`) or on first use,
    fetched again in the background once REFRESH_WINDOW of its lifetime has passed (until
    then, and while a refresh fails, the one held is used as long as it is valid). Once it
    has ended with no new one, a login fails with the endpoint's last refusal, which is
    asked for again at most every RETRY_PAUSE seconds.

    Each request runs in a thread of its own, waited for at most a bound; a daemon, so
    that one the endpoint never answers holds up neither a login nor the exit. One request
    at a time: while one not answered in time still runs, the next attempt waits on it
    rather than start another, for STUCK_AFTER of its bounds at most."""

    def __init__(
        self,
        endpoint: TokenEndpoint,
        fetch: Fetch = http_fetch,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.endpoint = endpoint
        self.fetches = 0  # tokens received, for status
        self.last_error: str | None = None  # why the last fetch failed (None: it worked)
        self._failed: tuple[float, TokenError] | None = None  # when, and why (monotonic)
        self._fetch = fetch
        self._clock = clock
        self._token: Token | None = None
        self._refresh_at = 0.0  # wall clock
        self._lock = asyncio.Lock()
        self._refresher: asyncio.Task[None] | None = None
        # the request under way: when it was asked (the clock), its answer to come, and
        # until when (monotonic) another is not sent beside it
        self._asking: tuple[float, Future[tuple[int, bytes]], float] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"TokenSource({self.endpoint.describe()})"

    @property
    def token(self) -> Token | None:
        return self._token

    def fetch_first(self, within: float = REQUEST_TIMEOUT) -> Token:
        """The first token, asked for before the tunnel runs (blocking; no event loop yet),
        waited for at most `within` seconds (the start timeout): TokenError, naming the
        endpoint and what went wrong, stops the start."""
        within = min(within, threading.TIMEOUT_MAX)
        asked, answer = self._ask(within)
        try:
            status, body = answer.result(timeout=within)
        except (TimeoutError, NoAnswer):
            fix = ", or give it longer with --start-timeout"
            raise NoAnswer(unanswered(self.endpoint, within, fix)) from None
        return self._keep(read_token_answer(self.endpoint, status, body, asked))

    async def current(self) -> Token:
        """A token valid now: the one held, or a new one (TokenError if none comes)."""
        token = self._token
        if token is None or token.ended(self._clock()):
            try:
                token = await self._renew(token)
            except TokenError as cause:
                if token is None:
                    raise
                ended = _clock_time(token.ends_at)
                raise TokenError(f"the token ended at {ended} and no new one came: {cause}",
                                 permanent=cause.permanent) from None  # fmt: skip
        if not self._closed and (self._refresher is None or self._refresher.done()):
            self._refresher = asyncio.get_running_loop().create_task(self._refresh())
        return token

    def close(self) -> None:
        """No refresh from now on (the tunnel stops; a login still under way may end
        after this, and must not start another)."""
        self._closed = True
        if self._refresher is not None:
            self._refresher.cancel()

    async def _renew(self, seen: Token | None, again: bool = False) -> Token:
        """A new token, unless another came meanwhile; TokenError if the endpoint gives
        none, or (unless `again`) gave none less than RETRY_PAUSE seconds ago."""
        async with self._lock:  # one request at a time; those waiting take its token
            if self._token is not None and self._token is not seen:
                return self._token
            failed = self._failed
            if not again and failed and time.monotonic() - failed[0] < RETRY_PAUSE:
                raise failed[1]
            asked, answer = self._ask(REQUEST_TIMEOUT)
            try:
                try:
                    status, body = await asyncio.wait_for(
                        asyncio.wrap_future(answer), REQUEST_TIMEOUT
                    )
                except (TimeoutError, NoAnswer):
                    raise NoAnswer(unanswered(self.endpoint, REQUEST_TIMEOUT, "")) from None
                token = read_token_answer(self.endpoint, status, body, asked)
            except TokenError as cause:
                self._failed, self.last_error = (time.monotonic(), cause), str(cause)
                raise
            except Exception as bug:  # no answer should: a failed refresh all the same
                failure = self._bug(bug)
                self._failed, self.last_error = (time.monotonic(), failure), str(failure)
                raise failure from None
            return self._keep(token)

    def _bug(self, bug: Exception) -> TokenError:
        """A failure no answer should cause, as a TokenError: the refresh goes on, status
        and the log say it (the traceback at DEBUG, for a report), RETRY_PAUSE applies."""
        log.debug("OAUTHBEARER: internal error asking for a token", exc_info=bug)
        said = _printable(str(bug), self.endpoint) or "no message"
        return TokenError(f"no token from the token endpoint {self.endpoint.url} for client "
                          f"{self.endpoint.client_id}: internal error: {type(bug).__name__}: "
                          f"{said} (a kafkatunnel bug: please report it with the output of "
                          "-vv)")  # fmt: skip

    def _ask(self, within: float) -> tuple[float, Future[tuple[int, bytes]]]:
        """The request still running, or a new one (each of its waits bounded by
        `within`): when it was asked (the clock), and its answer to come."""
        asking = self._asking
        if asking is not None and not asking[1].done() and time.monotonic() < asking[2]:
            return asking[0], asking[1]
        answer: Future[tuple[int, bytes]] = Future()
        answer.set_running_or_notify_cancel()  # a waiter that gives up does not cancel it

        def ask() -> None:
            try:
                answer.set_result(self._fetch(self.endpoint, within))
            except Exception as cause:  # a TokenError, or the fetch's bug: the waiter's
                answer.set_exception(cause)

        # urllib bounds each wait, not the whole: a request an endpoint keeps alive a byte
        # at a time is given up on after STUCK_AFTER of its bounds (left to end on its
        # own), so that the token can still be renewed once the endpoint is well again
        self._asking = (self._clock(), answer, time.monotonic() + STUCK_AFTER * within)
        threading.Thread(target=ask, name="token-endpoint", daemon=True).start()
        return self._asking[0], answer

    def _keep(self, token: Token) -> Token:
        self._token, self._failed, self.last_error = token, None, None
        self._refresh_at = token.asked_at + REFRESH_WINDOW * token.lifetime
        self.fetches += 1
        log.info("OAUTHBEARER: a token for %s, valid for %.0f s",
                 self.endpoint.describe(), token.lifetime)  # fmt: skip
        return token

    async def _refresh(self) -> None:
        said = None  # the failure last logged as a warning: the same one again is not
        while True:
            await asyncio.sleep(max(0.0, self._refresh_at - self._clock()))
            try:
                await self._renew(self._token, again=True)
                said = None
            except TokenError as cause:
                held = self._token
                ends = (
                    "" if held is None else f" (the token held ends at {_clock_time(held.ends_at)})"
                )
                (log.debug if str(cause) == said else log.warning)(
                    "OAUTHBEARER: the token was not refreshed%s: %s", ends, cause
                )
                said = str(cause)
                self._refresh_at = self._clock() + RETRY_PAUSE


def _clock_time(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))
