"""The tunnel logs in for its clients: every stream it opens to a broker (after TLS, with
--tls) first runs a SASL login (protocol.Login) with the user's credentials, so clients
see a broker that wants none and keep `bootstrap.servers` as their only setting.

This is a forwarder around the one that opens the streams, as TLS is: client connections,
the start check and the broker discovery all open their streams through it, and none of
them sees the login. Its frames go to the broker before any pump runs, so they never
reach a client or a recording. The outcome per broker is kept for status: the principal,
and the broker's message when its last login failed (a revoked or expired secret fails
the connections opened after it; those already open keep theirs).

With OAUTHBEARER the secret is a bearer token from the identity provider's token endpoint
(tunnel/oauth_token.py): each login takes the current one, which all share."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from kafkatunnel.protocol import (
    CLOSED_DURING_LOGIN,
    SCRAM_HASHES,
    LoggedIn,
    Login,
    LoginFailed,
    Mechanism,
    OAuthBearer,
    Plain,
    Scram,
)
from kafkatunnel.tunnel.forwarders import (
    Forwarder,
    ForwarderError,
    NoAnswer,
    Reauthentication,
    Upstream,
    WrappingForwarder,
    time_left,
)
from kafkatunnel.tunnel.oauth_token import Token, TokenError, TokenSource

MECHANISMS = ("PLAIN", *SCRAM_HASHES, "OAUTHBEARER")


@dataclass(frozen=True)
class Credentials:
    """Who the tunnel logs in as. The password is held in memory only, as bytes, and never
    shown: repr names the mechanism and the user. `source`: where it came from, as the user
    said it (--sasl-password-file FILE, --kafka-user NAME), for messages. OAUTHBEARER:
    the user is the client id, `tokens` the source of the tokens it logs in with."""

    mechanism: str
    username: str
    password: bytes = field(repr=False)
    source: str = ""
    _salted: dict[tuple[bytes, int], bytes] = field(default_factory=dict, repr=False, compare=False)
    tokens: TokenSource | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"{self.mechanism!r} is not one of {', '.join(MECHANISMS)}")
        if (self.mechanism == "OAUTHBEARER") != (self.tokens is not None):
            raise ValueError("OAUTHBEARER, and only it, logs in with tokens from an endpoint")

    async def token(self) -> Token | None:
        """The token a login sends now (OAUTHBEARER; None for the others): TokenError when
        the endpoint gives none."""
        return None if self.tokens is None else await self.tokens.current()

    def conversation(self, token: Token | None = None) -> Mechanism:
        """A new conversation for one connection (SCRAM's derived keys shared by all;
        OAUTHBEARER's `token` from `token()`)."""
        if self.mechanism == "PLAIN":
            return Plain(self.username, self.password)
        if self.mechanism == "OAUTHBEARER":
            assert token is not None
            return OAuthBearer(self.username, token.value)
        return Scram(self.mechanism, self.username, self.password, salted=self._salted)


class LoginRefused(ForwarderError):
    """The broker refused the login, or its answer could not be trusted: asking again with
    the same credentials will not help."""

    def __init__(self, failure: LoginFailed, broker: str, source: str = "") -> None:
        fixes = OAUTHBEARER_FIXES if failure.mechanism == "OAUTHBEARER" else FIXES
        fix = fixes.get(failure.error_code or 0, "").format(source=source or "as given")
        super().__init__(f"broker {broker}: {failure.describe()}{fix}", permanent=True)
        self.failure = failure


# What the user can do about Kafka's answer, by its error code.
FIXES = {
    58: "; check the password ({source}) and that the user exists for this mechanism",
    33: "; give --sasl-mechanism one the listener enables",
}
OAUTHBEARER_FIXES = {
    58: "; the broker does not take the token of {source}: check the audience and issuer "
    "its listener expects and the keys it trusts (the token endpoint's)",
    33: FIXES[33],
}


# When a session the broker ends is renewed: after a share of its lifetime picked at random
# in this range for each login, as Kafka's own client does (KIP-368), so that connections
# opened together do not all pause together; the rest is for the answers still in flight.
REAUTHENTICATE_WITHIN = (0.85, 0.95)
# Kafka's broker refuses a re-authentication less than a second after the last one
# (KafkaChannel.MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS).
REAUTHENTICATE_AFTER = 1.0


@dataclass
class BrokerLogin:
    """The last login to one broker, for status."""

    mechanism: str
    principal: str
    session_lifetime_ms: int | None = None
    logged_in_at: float | None = None
    reauthentications: int = 0  # logins again on connections that stayed open (KIP-368)
    error: str | None = None
    error_at: float | None = None
    token_expires_at: float | None = None  # OAUTHBEARER: when the token it sent ends

    def as_dict(self) -> dict[str, object]:
        shown: dict[str, object] = {
            "mechanism": self.mechanism,
            "principal": self.principal,
            "session_lifetime_ms": self.session_lifetime_ms,
            "logged_in_at": self.logged_in_at,
            "reauthentications": self.reauthentications,
            "error": self.error,
            "error_at": self.error_at,
        }
        if self.mechanism == "OAUTHBEARER":
            shown["token_expires_at"] = self.token_expires_at
        return shown


async def log_in(
    upstream: Upstream, mechanism: Mechanism, broker: str, again: LoggedIn | None = None
) -> LoggedIn | LoginFailed:
    """Run one login over `upstream` (`again`: a re-authentication after that login); the
    outcome. OSError or ForwarderError if the stream fails (the forwarder's reason)."""
    login = Login(mechanism, again=again)
    await upstream.send(login.start())
    while login.outcome is None:
        data = await upstream.receive()
        if not data:
            reason = await upstream.why_ended(None)
            if reason is not None:
                raise ForwarderError(f"{broker}: {reason}")
            login.ended()
            break
        for request in login.feed(data):
            await upstream.send(request)
    assert login.outcome is not None
    return login.outcome


class LoginForwarder(WrappingForwarder):
    """Any forwarder (TLS among them), with a login on each stream it opens."""

    def __init__(self, inner: Forwarder, credentials: Credentials, timeout: float = 10.0) -> None:
        """`timeout`: seconds a login may take (a stream whose broker never answers it is
        closed then, not kept)."""
        super().__init__(inner)
        self.credentials = credentials
        self.timeout = timeout
        self.logins: dict[tuple[str, int], BrokerLogin] = {}

    def login(self, host: str, port: int) -> dict[str, object]:
        """The last login to host:port, for status (who, even before the first);
        OAUTHBEARER: why the token could not be fetched last, if it could not."""
        found = self.logins.get((host, port))
        if found is None:
            found = BrokerLogin(self.credentials.mechanism, self.credentials.username)
        shown = found.as_dict()
        if self.credentials.tokens is not None:
            shown["token_error"] = self.credentials.tokens.last_error
        return shown

    async def close(self) -> None:
        if self.credentials.tokens is not None:
            self.credentials.tokens.close()  # no refresh after the tunnel stopped
        await super().close()

    async def open(self, host: str, port: int) -> Upstream:
        token = await self._token_in_time(host, port)
        upstream = await self.inner.open(host, port)
        try:
            login = self.run(upstream, host, port, token)
            outcome = await asyncio.wait_for(login, time_left(self.timeout))
        except TimeoutError:
            await upstream.discard()
            raise NoAnswer(f"{host}:{port}: no answer to the login within "
                           f"{self.timeout:g}s") from None  # fmt: skip
        except ForwarderError:
            await upstream.discard()
            raise
        except BaseException:
            upstream.close()
            upstream.release()
            raise
        upstream.reauthentication = SessionRenewal(self, host, port, outcome)
        return upstream

    async def _token_in_time(self, host: str, port: int) -> Token | None:
        """The token, within the open's time: a token endpoint slower than that fails the
        open saying so (not NoAnswer: the forward is not in question). The fetch goes on,
        and the token it brings is kept for the next login."""
        tokens = self.credentials.tokens
        fetching = asyncio.ensure_future(self.token(host, port))
        try:
            return await asyncio.wait_for(asyncio.shield(fetching), time_left(self.timeout))
        except TimeoutError:
            fetching.add_done_callback(_retrieved)
            where = "" if tokens is None else f" ({tokens.endpoint.url})"
            late = (f"{host}:{port}: no token from the token endpoint{where} within "
                    f"{self.timeout:g}s; it is asked for one still")  # fmt: skip
            raise ForwarderError(late) from None

    async def token(self, host: str, port: int) -> Token | None:
        """The token a login to host:port sends now (OAUTHBEARER; None for the others).
        TokenError, noted for status, when the endpoint gives none."""
        try:
            return await self.credentials.token()
        except TokenError as no_token:
            said = self.logins.setdefault((host, port), BrokerLogin(
                self.credentials.mechanism, self.credentials.username))  # fmt: skip
            said.error, said.error_at = str(no_token), time.time()
            raise

    async def run(
        self,
        upstream: Upstream,
        host: str,
        port: int,
        token: Token | None,
        again: LoggedIn | None = None,
    ) -> LoggedIn:
        """Log in over `upstream` (with `token`, for OAUTHBEARER; again: re-authenticate
        after that login), noting the outcome for status. LoginRefused if the broker
        refuses, ForwarderError if the stream fails; the caller closes the stream then."""
        broker = f"{host}:{port}"
        conversation = self.credentials.conversation(token)
        try:
            outcome = await log_in(upstream, conversation, broker, again)
        except OSError as error:
            reason = await upstream.why_ended(error) or str(error)
            raise ForwarderError(f"{broker}: during the login: {reason}") from None
        state = self.logins.setdefault(
            (host, port), BrokerLogin(outcome.mechanism, outcome.principal)
        )
        if isinstance(outcome, LoginFailed):
            refused = LoginRefused(outcome, broker, self.credentials.source)
            if outcome.error_code is None and outcome.message == CLOSED_DURING_LOGIN:
                raise ForwarderError(str(refused))  # perhaps the stream, not the login
            state.error, state.error_at = str(refused), time.time()
            raise refused
        state.session_lifetime_ms = outcome.session_lifetime_ms
        state.logged_in_at, state.error, state.error_at = time.time(), None, None
        state.reauthentications += again is not None
        state.token_expires_at = None if token is None else token.expires_at
        return outcome


class SessionRenewal(Reauthentication):
    """One stream's login, renewed on the same stream before the broker's session ends."""

    def __init__(self, forwarder: LoginForwarder, host: str, port: int, last: LoggedIn) -> None:
        self.forwarder = forwarder
        self.host, self.port = host, port
        self._logged_in(last)

    def _logged_in(self, outcome: LoggedIn) -> None:
        self.last, self.at = outcome, time.monotonic()
        self.share = random.uniform(*REAUTHENTICATE_WITHIN)

    def due_in(self) -> float | None:
        lifetime = self.last.session_lifetime_ms / 1000
        if not lifetime:
            return None
        due = max(lifetime * self.share, REAUTHENTICATE_AFTER)
        return max(0.0, due - (time.monotonic() - self.at))

    async def again(self, upstream: Upstream) -> None:
        token = await self.forwarder.token(self.host, self.port)  # the current one
        self._logged_in(await self.forwarder.run(upstream, self.host, self.port, token,
                                                 self.last))  # fmt: skip


def _retrieved(done: asyncio.Future[Token | None]) -> None:
    """A fetch nobody waits for any more: its failure is noted for status already (see
    LoginForwarder.token), not an error nobody retrieved."""
    if not done.cancelled():
        done.exception()
