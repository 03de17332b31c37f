"""The tunnel's login as a state machine over bytes: the frames it sends read back with
kio (Kafka's own schemas), the broker's answers encoded with kio. SCRAM's arithmetic is
held to RFC 7677's published example; that it matches Kafka's is shown on Apache Kafka's
own listeners (tests/apache/test_login.py)."""

from __future__ import annotations

import datetime
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader

from kafkatunnel.protocol.sasl_login import (
    API_VERSIONS,
    FIRST_CORRELATION,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    LoggedIn,
    Login,
    LoginFailed,
)
from kafkatunnel.protocol.sasl_mechanisms import Plain, Scram
from tests.kio_messages import encode, response_frame

pytestmark = pytest.mark.quick

# RFC 7677 section 3: SCRAM-SHA-256 for user "user", password "pencil"
RFC_NONCE = b"rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")  # fmt: skip
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")  # fmt: skip
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
WRONG_PASSWORD = ("Authentication failed during authentication due to invalid credentials "
                  "with SASL mechanism SCRAM-SHA-256")  # Kafka's own words  # fmt: skip
SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM = 58, 33


def rfc_user(password: bytes = b"pencil") -> Scram:
    return Scram("SCRAM-SHA-256", "user", password, nonce=lambda: RFC_NONCE)


def sent(request: bytes) -> tuple[int, Any]:
    """A request frame the login sent: its correlation id and its message, read by kio."""
    key, version = struct.unpack_from(">hh", request, 4)
    schema: Any = load_request_schema(key, version)
    header_type: Any = RequestHeaderV2 if schema.__flexible__ else RequestHeaderV1
    header, offset = entity_reader(header_type)(request[4:], 0)
    message, size = entity_reader(schema)(request[4:], offset)
    assert offset + size == len(request) - 4
    assert header.client_id == "kafkatunnel-login"
    return int(header.correlation_id), message


def answer(request: bytes, **fields: Any) -> bytes:
    """The broker's answer to `request`, with `fields`."""
    correlation, message = sent(request)
    key, version = int(message.__api_key__), int(message.__version__)
    schema: Any = load_response_schema(key, version)
    if "error_code" in fields:
        fields["error_code"] = ErrorCode(fields["error_code"])
    return response_frame(key, version, encode(schema(**fields)), correlation)


def versions(authenticate: tuple[int, int] | None = (0, 2), handshake: tuple[int, int] = (0, 1),
             request: bytes | None = None) -> dict[str, Any]:  # fmt: skip
    schema: Any = load_response_schema(API_VERSIONS, 0)
    entry = schema.__dataclass_fields__["api_keys"].type.__args__[0]
    keys = [(SASL_HANDSHAKE, *handshake), (API_VERSIONS, 0, 3)]
    if authenticate is not None:
        keys.append((SASL_AUTHENTICATE, *authenticate))
    return {"error_code": 0, "api_keys": tuple(
        entry(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in keys)}  # fmt: skip


def authenticated(lifetime_ms: int = 0, auth_bytes: bytes = b"", code: int = 0,
                  message: str | None = None) -> dict[str, Any]:  # fmt: skip
    return {"error_code": code, "error_message": message, "auth_bytes": auth_bytes,
            "session_lifetime": datetime.timedelta(milliseconds=lifetime_ms)}  # fmt: skip


def through_handshake(login: Login, **version_fields: Any) -> bytes:
    """Drive the login to its first SaslAuthenticate, which is returned."""
    first = login.start()
    assert sent(first)[1].__api_key__ == API_VERSIONS
    (handshake,) = login.feed(answer(first, **versions(**version_fields)))
    assert sent(handshake)[1].mechanism == login.mechanism.name
    (authenticate,) = login.feed(answer(handshake, error_code=0,
                                        mechanisms=(login.mechanism.name,)))  # fmt: skip
    return authenticate


def test_scram_sha_256_logs_in_as_rfc_7677_shows_with_the_session_lifetime() -> None:
    login = Login(rfc_user())
    first = through_handshake(login)
    message = sent(first)[1]
    assert (message.__version__, message.auth_bytes) == (2, b"n,,n=user,r=" + RFC_NONCE)
    (final,) = login.feed(answer(first, **authenticated(auth_bytes=RFC_SERVER_FIRST)))
    assert sent(final)[1].auth_bytes == RFC_CLIENT_FINAL
    assert login.outcome is None
    assert login.feed(answer(final, **authenticated(3_600_000, RFC_SERVER_FINAL))) == []
    assert login.outcome == LoggedIn("SCRAM-SHA-256", "user", 3_600_000)


def test_the_frames_carry_the_tunnels_own_correlation_ids_in_order() -> None:
    login = Login(rfc_user(), first_correlation=5000)
    frames = [login.start()]
    frames += login.feed(answer(frames[-1], **versions()))
    frames += login.feed(answer(frames[-1], error_code=0, mechanisms=()))
    frames += login.feed(answer(frames[-1], **authenticated(auth_bytes=RFC_SERVER_FIRST)))
    assert [sent(f)[0] for f in frames] == [5000, 5001, 5002, 5003]
    assert Login(rfc_user()).start() != frames[0]  # by default, its own range
    assert sent(Login(rfc_user()).start())[0] == FIRST_CORRELATION


def test_an_answer_to_another_request_ends_the_login() -> None:
    login = Login(rfc_user())
    first = login.start()
    schema: Any = load_response_schema(API_VERSIONS, 0)
    fields = {**versions(), "error_code": ErrorCode(0)}
    stray = response_frame(API_VERSIONS, 0, encode(schema(**fields)), FIRST_CORRELATION + 9)
    assert login.feed(stray) == []
    assert isinstance(login.outcome, LoginFailed) and login.outcome.error_code is None
    assert "did not send" in login.outcome.message
    assert login.feed(answer(first, **versions())) == []  # nothing after the end


def test_a_wrong_password_ends_with_kafkas_code_and_message_naming_mechanism_and_user() -> None:
    login = Login(rfc_user(b"not-pencil"))
    first = through_handshake(login)
    (final,) = login.feed(answer(first, **authenticated(auth_bytes=RFC_SERVER_FIRST)))
    assert sent(final)[1].auth_bytes != RFC_CLIENT_FINAL  # another password, another proof
    said = answer(final, **authenticated(code=SASL_AUTHENTICATION_FAILED, message=WRONG_PASSWORD))
    assert login.feed(said) == []
    outcome = login.outcome
    assert outcome == LoginFailed("SCRAM-SHA-256", "user", SASL_AUTHENTICATION_FAILED,
                                  WRONG_PASSWORD)  # fmt: skip
    assert outcome.describe() == (f"login as user with SCRAM-SHA-256 failed: {WRONG_PASSWORD} "
                                  "(SASL_AUTHENTICATION_FAILED)")  # fmt: skip


@pytest.mark.parametrize(
    ("server_final", "said"),
    [
        (b"v=" + RFC_SERVER_FINAL[2:].replace(b"6", b"7", 1), "signature does not verify"),
        (b"v=", "signature does not verify"),
        (b"v=not base64!", "signature does not verify"),
        (b"e=invalid-proof", "ended the SCRAM exchange: invalid-proof"),
        (b"garbage", "not SCRAM"),
    ],
)
def test_a_server_that_cannot_prove_it_knows_the_password_is_not_trusted(
    server_final: bytes, said: str
) -> None:
    """The broker accepts the login (no error code) but its final message does not carry
    the signature only a holder of the password can compute: the login fails."""
    login = Login(rfc_user())
    first = through_handshake(login)
    (final,) = login.feed(answer(first, **authenticated(auth_bytes=RFC_SERVER_FIRST)))
    login.feed(answer(final, **authenticated(auth_bytes=server_final)))
    assert isinstance(login.outcome, LoginFailed), login.outcome
    assert login.outcome.error_code is None and said in login.outcome.message


@pytest.mark.parametrize(
    ("server_first", "said"),
    [
        (RFC_SERVER_FIRST.replace(b"r=rOpr", b"r=xOpr"), "does not extend the client's"),
        (b"r=" + RFC_NONCE + b",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", "does not extend"),
        (RFC_SERVER_FIRST.replace(b"i=4096", b"i=4095"), "4095 iterations"),
        (RFC_SERVER_FIRST.replace(b"i=4096", b"i=999999999"), "999999999 iterations"),
        (RFC_SERVER_FIRST.replace(b"i=4096", b"i=x"), "not a number"),
        (RFC_SERVER_FIRST.replace(b"s=W22", b"s=*22"), "salt is not base64"),
        (RFC_SERVER_FIRST.replace(b",i=4096", b""), "lacks its nonce, salt or count"),
        (b"m=ext," + RFC_SERVER_FIRST, "extension"),
        (b"", "not SCRAM"),
    ],
)
def test_a_server_first_message_that_is_not_sound_ends_the_login(
    server_first: bytes, said: str
) -> None:
    login = Login(rfc_user())
    first = through_handshake(login)
    assert login.feed(answer(first, **authenticated(auth_bytes=server_first))) == []
    assert isinstance(login.outcome, LoginFailed) and said in login.outcome.message, login.outcome


def test_a_mechanism_the_listener_does_not_enable_is_named_with_those_it_does() -> None:
    login = Login(rfc_user())
    first = login.start()
    (handshake,) = login.feed(answer(first, **versions()))
    login.feed(answer(handshake, error_code=UNSUPPORTED_SASL_MECHANISM,
                      mechanisms=("PLAIN", "SCRAM-SHA-512")))  # fmt: skip
    assert login.outcome == LoginFailed(
        "SCRAM-SHA-256",
        "user",
        UNSUPPORTED_SASL_MECHANISM,
        "the listener does not enable SCRAM-SHA-256 (it enables: PLAIN, SCRAM-SHA-512)",
    )
    assert "(UNSUPPORTED_SASL_MECHANISM)" in login.outcome.describe()


ESCAPES = "\x1b]0;owned\x07\x1b[2J\r\n"  # a terminal's title, a clear screen, a new line


def said_to_the_user(outcome: object) -> str:
    assert isinstance(outcome, LoginFailed), outcome
    return outcome.describe()


@pytest.mark.parametrize("where", ["error message", "mechanisms", "scram error"])
def test_what_a_broker_says_reaches_the_user_as_one_printable_line_cut_short(where: str) -> None:
    """A broker's words go to the log, status and the terminal: a broker that is not the
    cluster's (or a broken one) can neither write escape sequences there nor fill it."""
    text = ESCAPES + "x" * 5000
    login = Login(rfc_user())
    if where == "mechanisms":
        (handshake,) = login.feed(answer(login.start(), **versions()))
        login.feed(answer(handshake, error_code=UNSUPPORTED_SASL_MECHANISM, mechanisms=(text,)))
    else:
        first = through_handshake(login)
        if where == "error message":
            login.feed(answer(first, **authenticated(code=SASL_AUTHENTICATION_FAILED,
                                                     message=text)))  # fmt: skip
        else:
            (final,) = login.feed(answer(first, **authenticated(auth_bytes=RFC_SERVER_FIRST)))
            login.feed(answer(final, **authenticated(auth_bytes=b"e=" + text.encode())))
    said = said_to_the_user(login.outcome)
    assert said.isprintable() and "owned" in said, said  # the words stay, the escapes do not
    assert len(said) < 500 and said.count("x") < 400, len(said)


def test_plain_sends_the_user_and_password_once() -> None:
    login = Login(Plain("alice", b"s3cret"))
    first = through_handshake(login)
    assert sent(first)[1].auth_bytes == b"\0alice\0s3cret"
    assert login.feed(answer(first, **authenticated(60_000))) == []
    assert login.outcome == LoggedIn("PLAIN", "alice", 60_000)


@pytest.mark.parametrize(("offered", "used"), [((0, 0), 0), ((0, 1), 1), ((1, 2), 2),
                                                ((0, 7), 2)])  # fmt: skip
def test_the_newest_sasl_authenticate_up_to_v2_is_used(offered: tuple[int, int], used: int) -> None:
    login = Login(Plain("alice", b"s3cret"))
    first = through_handshake(login, authenticate=offered)
    assert sent(first)[1].__version__ == used
    fields = authenticated(60_000)
    if used == 0:
        del fields["session_lifetime"]
    login.feed(answer(first, **fields))
    assert login.outcome == LoggedIn("PLAIN", "alice", 60_000 if used else 0, used)


@pytest.mark.parametrize(
    ("version_fields", "said"),
    [({"authenticate": None}, "offers no SaslAuthenticate"),
     ({"handshake": (0, 0)}, "offers no SaslHandshake v1")],
)  # fmt: skip
def test_a_broker_without_the_login_apis_is_refused(version_fields: Any, said: str) -> None:
    login = Login(Plain("alice", b"s3cret"))
    first = login.start()
    assert login.feed(answer(first, **versions(**version_fields))) == []
    assert isinstance(login.outcome, LoginFailed) and said in login.outcome.message


def test_bytes_that_come_one_at_a_time_make_the_same_login() -> None:
    login = Login(rfc_user())
    first = through_handshake(login)
    server_first = answer(first, **authenticated(auth_bytes=RFC_SERVER_FIRST))
    out = [frame for i in range(len(server_first)) for frame in login.feed(server_first[i : i + 1])]
    assert [sent(f)[1].auth_bytes for f in out] == [RFC_CLIENT_FINAL]


def test_a_close_before_the_outcome_is_a_failure_and_after_it_changes_nothing() -> None:
    login = Login(rfc_user())
    login.start()
    login.ended()
    assert isinstance(login.outcome, LoginFailed) and "closed" in login.outcome.message
    done = Login(Plain("alice", b"s3cret"))
    done.feed(answer(through_handshake(done), **authenticated()))
    done.ended()
    assert isinstance(done.outcome, LoggedIn)


def test_an_oversized_or_unreadable_answer_fails_the_login_not_the_caller() -> None:
    login = Login(rfc_user())
    login.start()
    assert login.feed(struct.pack(">i", 1 << 30)) == []
    assert isinstance(login.outcome, LoginFailed) and "not Kafka protocol" in login.outcome.message
    other = Login(rfc_user())
    other.start()
    other.feed(struct.pack(">ii", 4, FIRST_CORRELATION))  # a correlation id, then nothing
    assert isinstance(other.outcome, LoginFailed) and "cannot be read" in other.outcome.message


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=6), st.integers(0, 3))
def test_whatever_a_broker_sends_the_login_ends_or_waits_never_raises(
    chunks: list[bytes], answered: int
) -> None:
    """Any bytes, after `answered` sound answers: never an exception, and once the outcome
    is set, nothing more is sent."""
    login = Login(Plain("alice", b"s3cret"))
    last = login.start()
    script = [versions(), {"error_code": 0, "mechanisms": ("PLAIN",)}, authenticated()]
    for fields in script[:answered]:
        out = login.feed(answer(last, **fields))
        last = out[0] if out else last
    for chunk in chunks:
        out = login.feed(chunk)
        assert not (out and login.outcome is not None)


def test_no_secret_shows_in_a_mechanism_or_an_outcome() -> None:
    scram, plain = rfc_user(b"pencil-s3cret"), Plain("alice", b"plain-s3cret")
    assert "s3cret" not in repr(scram) + repr(plain)
    assert repr(scram) == "Scram(SCRAM-SHA-256 as 'user')"
    failed = LoginFailed("PLAIN", "alice", SASL_AUTHENTICATION_FAILED, "invalid credentials")
    assert "s3cret" not in repr(failed) + failed.describe()


def test_the_salted_password_is_derived_once_per_salt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each connection logs in: the PBKDF2 derivation (milliseconds of the event loop) is
    paid once while the broker's salt and count stay the same, again when they change."""
    import hashlib

    calls = []
    derive = hashlib.pbkdf2_hmac

    def counted(*args: Any) -> bytes:
        calls.append(args[2])
        return derive(*args)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    mechanism = rfc_user()
    for server_first in (RFC_SERVER_FIRST, RFC_SERVER_FIRST,
                         RFC_SERVER_FIRST.replace(b"i=4096", b"i=4097")):  # fmt: skip
        mechanism.first()
        mechanism.answer(server_first)
    assert len(calls) == 2


def test_scram_refuses_an_unknown_hash_and_a_nonce_with_a_comma() -> None:
    with pytest.raises(ValueError, match="SCRAM-SHA-1 is not one of"):
        Scram("SCRAM-SHA-1", "user", b"pencil")
    login = Login(Scram("SCRAM-SHA-256", "user", b"pencil", nonce=lambda: b"a,b"))
    through_handshake_fails = login.start()
    (handshake,) = login.feed(answer(through_handshake_fails, **versions()))
    assert login.feed(answer(handshake, error_code=0, mechanisms=())) == []
    assert isinstance(login.outcome, LoginFailed) and "without a comma" in login.outcome.message


def test_user_names_are_escaped_as_rfc_5802_says() -> None:
    mechanism = Scram("SCRAM-SHA-512", "a=b,c", b"pw", nonce=lambda: b"n0nce")
    assert mechanism.first() == b"n,,n=a=3Db=2Cc,r=n0nce"
    assert b"r=" in Scram("SCRAM-SHA-512", "u", b"pw").first()  # a random nonce by default


@pytest.mark.parametrize("version", [0, 1, 2])
def test_a_re_authentication_starts_with_the_handshake_and_keeps_the_authenticate_version(
    version: int,
) -> None:
    """KIP-368: on a logged-in connection the broker takes a SaslHandshake as the start of
    a re-authentication; no ApiVersions comes first, and SaslAuthenticate keeps the version
    the first login used."""
    first = Login(Plain("alice", b"s3cret"))
    login_frame = through_handshake(first, authenticate=(0, version))
    fields = authenticated(60_000)
    if version == 0:
        del fields["session_lifetime"]
    first.feed(answer(login_frame, **fields))
    assert isinstance(first.outcome, LoggedIn)
    again = Login(Plain("alice", b"s3cret"), again=first.outcome)
    handshake = again.start()
    assert sent(handshake)[1].__api_key__ == SASL_HANDSHAKE
    assert sent(handshake)[0] == FIRST_CORRELATION
    (authenticate,) = again.feed(answer(handshake, error_code=0, mechanisms=("PLAIN",)))
    message = sent(authenticate)[1]
    assert (message.__version__, message.auth_bytes) == (version, b"\0alice\0s3cret")
    fields = authenticated(30_000)
    if version == 0:
        del fields["session_lifetime"]
    again.feed(answer(authenticate, **fields))
    assert again.outcome == LoggedIn("PLAIN", "alice", 30_000 if version else 0, version)
