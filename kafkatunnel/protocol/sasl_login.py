"""The tunnel's own login to a broker, as a small state machine over bytes: the frames to
send, then the broker's answers read, until the outcome is known. The caller moves the
bytes (tunnel/login.py); nothing here touches a socket.

The conversation is Kafka's own client's (KIP-43, KIP-152): ApiVersions, to learn which
SaslAuthenticate versions the broker has; SaslHandshake v1 naming the mechanism; then
SaslAuthenticate requests carrying the mechanism's messages until it has nothing more to
say. The newest SaslAuthenticate up to v2 is used: from v1 the broker's last answer says
how long the session lasts (KIP-368), after which the connection must log in again.

A re-authentication (KIP-368: the broker's session ran out, the connection goes on) is the
same conversation without ApiVersions: Kafka's broker takes a SaslHandshake on a logged-in
connection as the start of one (SocketServer hands it to
KafkaChannel.maybeBeginServerReauthentication), and the SaslAuthenticate version is the one
the first login used.

The frames carry the tunnel's own correlation ids (from `first_correlation`): on a
connection that re-authenticates they never meet the client's, which are not in flight
then. The outcome does not depend on who logs in: LoggedIn with the session lifetime, or
LoginFailed with Kafka's error code and its own message (or, with no code, what the
tunnel could not accept in the broker's answer)."""

from __future__ import annotations

import datetime
import io
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

from kafkatunnel.protocol.errors import ProtocolError
from kafkatunnel.protocol.framing import FrameDecoder, frame
from kafkatunnel.protocol.headers import response_body_offset, response_correlation_id
from kafkatunnel.protocol.sasl_mechanisms import Mechanism, MechanismError
from kafkatunnel.protocol.untrusted_text import one_line

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
HANDSHAKE_VERSION = 1  # v0 sends the mechanism's messages unframed, which Kafka 1.0 left
NEWEST_AUTHENTICATE = 2
CLIENT_ID = "kafkatunnel-login"
FIRST_CORRELATION = 0x6B74_0000  # "kt" and a count: easy to tell apart in a capture
MAX_ANSWER = 1 << 20  # a login's answers are small; a broker sending more is not one
# the failure when the stream ends first (perhaps the stream, not the login, failed)
CLOSED_DURING_LOGIN = "the broker closed the connection during the login"


@dataclass(frozen=True)
class LoggedIn:
    """The broker accepted the login. `session_lifetime_ms`: how long it lasts (0: for
    the connection's life, or a broker whose SaslAuthenticate v0 cannot say);
    `authenticate_version`: the SaslAuthenticate version used, for re-authentication."""

    mechanism: str
    principal: str
    session_lifetime_ms: int
    authenticate_version: int = NEWEST_AUTHENTICATE


@dataclass(frozen=True)
class LoginFailed:
    """The login did not succeed. `error_code`: Kafka's (None: the tunnel refused the
    broker's answer); `message`: Kafka's own text, or the tunnel's reason."""

    mechanism: str
    principal: str
    error_code: int | None
    message: str

    @property
    def error_name(self) -> str | None:
        if self.error_code is None:
            return None
        try:
            return ErrorCode(self.error_code).name.upper()
        except ValueError:
            return f"error {self.error_code}"

    def describe(self) -> str:
        """One line naming the mechanism, the principal and what the broker said."""
        cause = self.message if self.error_name is None else f"{self.message} ({self.error_name})"
        return f"login as {self.principal} with {self.mechanism} failed: {cause}"


Outcome = LoggedIn | LoginFailed


class Login:
    """One login: `start()` gives the first frame, `feed(bytes)` the frames to send next;
    `outcome` is set once the login ended either way (then nothing more is sent).
    `again`: re-authenticate a logged-in connection, with the LoggedIn of its last login."""

    def __init__(
        self,
        mechanism: Mechanism,
        first_correlation: int = FIRST_CORRELATION,
        again: LoggedIn | None = None,
    ) -> None:
        self.mechanism = mechanism
        self.outcome: Outcome | None = None
        self._correlation = first_correlation
        self._decoder = FrameDecoder(max_frame_size=MAX_ANSWER)
        self._awaiting: tuple[int, int, int] | None = None  # correlation, api key, version
        self._again = again is not None
        self._authenticate_version = 0 if again is None else again.authenticate_version

    def start(self) -> bytes:
        """The first frame: ApiVersions v0, which every broker answers before a login; or,
        re-authenticating, the SaslHandshake."""
        if self._again:
            return self._handshake()
        return self._request(load_request_schema(API_VERSIONS, 0)())

    def feed(self, data: bytes) -> list[bytes]:
        """Frames to send after the broker's bytes `data` (empty: wait for more, or the
        outcome is set)."""
        if self.outcome is not None:
            return []
        try:
            answers = self._decoder.feed(data)
        except ProtocolError as error:
            return self._fail(None, f"the broker's answer is not Kafka protocol: {error}")
        out: list[bytes] = []
        for answer in answers:
            if self.outcome is not None:
                break
            out.extend(self._answered(answer))
        return out

    def ended(self) -> None:
        """The broker closed the connection before the outcome was known."""
        if self.outcome is None:
            self._fail(None, CLOSED_DURING_LOGIN)

    # -- the conversation -----------------------------------------------------------------

    def _answered(self, answer: bytes) -> list[bytes]:
        assert self._awaiting is not None
        correlation, api_key, version = self._awaiting
        try:
            if response_correlation_id(answer) != correlation:
                return self._fail(None, "the broker answered a request the tunnel did not send")
            response = _decoded(answer, api_key, version)
        except (ProtocolError, ValueError) as error:
            return self._fail(None, f"the broker's answer cannot be read: {error}")
        self._awaiting = None
        if api_key == API_VERSIONS:
            return self._after_versions(response)
        if api_key == SASL_HANDSHAKE:
            return self._after_handshake(response)
        return self._after_authenticate(response)

    def _after_versions(self, response: Any) -> list[bytes]:
        versions = {int(k.api_key): (int(k.min_version), int(k.max_version))
                    for k in response.api_keys}  # fmt: skip
        low, high = versions.get(SASL_AUTHENTICATE, (0, -1))
        handshake = versions.get(SASL_HANDSHAKE, (0, -1))
        if int(response.error_code) != 0 or high < max(low, 0):
            return self._fail(None, "the broker offers no SaslAuthenticate: this listener "
                              "takes no SASL login")  # fmt: skip
        if not handshake[0] <= HANDSHAKE_VERSION <= handshake[1]:
            return self._fail(None, "the broker offers no SaslHandshake v1")
        self._authenticate_version = min(high, NEWEST_AUTHENTICATE)
        return [self._handshake()]

    def _handshake(self) -> bytes:
        request: Any = load_request_schema(SASL_HANDSHAKE, HANDSHAKE_VERSION)
        return self._request(request(mechanism=self.mechanism.name))

    def _after_handshake(self, response: Any) -> list[bytes]:
        code = int(response.error_code)
        if code != 0:
            enabled = one_line(", ".join(str(m) for m in response.mechanisms)) or "none"
            return self._fail(code, f"the listener does not enable {self.mechanism.name} "
                              f"(it enables: {enabled})")  # fmt: skip
        try:
            first = self.mechanism.first()
        except ValueError as error:
            return self._fail(None, str(error))
        return [self._authenticate(first)]

    def _after_authenticate(self, response: Any) -> list[bytes]:
        code = int(response.error_code)
        if code != 0:
            said = one_line(response.error_message) or "the broker gave no message"
            return self._fail(code, said)
        try:
            reply = self.mechanism.answer(bytes(response.auth_bytes))
        except MechanismError as error:
            return self._fail(None, str(error))
        if reply is not None:
            return [self._authenticate(reply)]
        lifetime = getattr(response, "session_lifetime", None)
        milliseconds = 0 if lifetime is None else _milliseconds(lifetime)
        self.outcome = LoggedIn(self.mechanism.name, self.mechanism.principal, milliseconds,
                                self._authenticate_version)  # fmt: skip
        return []

    def _authenticate(self, message: bytes) -> bytes:
        request: Any = load_request_schema(SASL_AUTHENTICATE, self._authenticate_version)
        return self._request(request(auth_bytes=message))

    def _request(self, payload: Any) -> bytes:
        api_key, version = int(payload.__api_key__), int(payload.__version__)
        correlation = self._correlation
        self._correlation = (correlation + 1) & 0x7FFF_FFFF
        self._awaiting = (correlation, api_key, version)
        header_type: Any = RequestHeaderV2 if payload.__flexible__ else RequestHeaderV1
        header = header_type(request_api_key=api_key, request_api_version=version,
                             correlation_id=correlation, client_id=CLIENT_ID)  # fmt: skip
        out = io.BytesIO()
        entity_writer(header_type)(out, header)
        entity_writer(type(payload))(out, payload)
        return frame(out.getvalue())

    def _fail(self, code: int | None, message: str) -> list[bytes]:
        self.outcome = LoginFailed(self.mechanism.name, self.mechanism.principal, code, message)
        return []


def _decoded(answer: bytes, api_key: int, version: int) -> Any:
    body = response_body_offset(answer, api_key, version)
    try:
        value, _ = entity_reader(load_response_schema(api_key, version))(answer[body:], 0)
    except Exception as error:  # kio's own errors: an answer it cannot decode
        raise ValueError(str(error) or type(error).__name__) from None
    return value


def _milliseconds(lifetime: datetime.timedelta) -> int:
    return max(0, lifetime // datetime.timedelta(milliseconds=1))
