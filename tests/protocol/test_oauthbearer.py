"""OAUTHBEARER as the tunnel's login sends it (RFC 7628, as Kafka's OAuthBearerSaslClient
does): the message read back with kio from the SaslAuthenticate frame, the broker's answers
encoded with kio. That Kafka takes it is shown on Apache Kafka's own OAUTHBEARER listener
(tests/apache/test_login_oauth.py)."""

from __future__ import annotations

import pytest

from kafkatunnel.protocol.sasl_login import LoggedIn, Login, LoginFailed
from kafkatunnel.protocol.sasl_mechanisms import MechanismError, OAuthBearer
from tests.protocol.test_sasl_login import answer, authenticated, sent, through_handshake

pytestmark = pytest.mark.quick

TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJrYWZrYXR1bm5lbCJ9.c2lnbmF0dXJl"
SASL_AUTHENTICATION_FAILED = 58
INVALID_TOKEN = '{"status":"invalid_token"}'  # what Kafka's OAuthBearerSaslServer says


def test_the_token_goes_in_one_message_as_kafkas_client_sends_it() -> None:
    login = Login(OAuthBearer("kafkatunnel", TOKEN))
    first = through_handshake(login)
    assert sent(first)[1].auth_bytes == b"n,,\x01auth=Bearer " + TOKEN.encode() + b"\x01\x01"
    assert login.feed(answer(first, **authenticated(30_000))) == []
    assert login.outcome == LoggedIn("OAUTHBEARER", "kafkatunnel", 30_000)


def test_a_refused_token_is_answered_with_control_a_and_ends_with_kafkas_message() -> None:
    """RFC 7628 3.2.3: the server's error challenge is answered `%x01`; Kafka then ends the
    exchange with its error code and its message."""
    login = Login(OAuthBearer("kafkatunnel", TOKEN))
    first = through_handshake(login)
    (reply,) = login.feed(answer(first, **authenticated(auth_bytes=INVALID_TOKEN.encode())))
    assert sent(reply)[1].auth_bytes == b"\x01"
    said = answer(reply, **authenticated(code=SASL_AUTHENTICATION_FAILED, message=INVALID_TOKEN))
    assert login.feed(said) == []
    assert login.outcome == LoginFailed("OAUTHBEARER", "kafkatunnel",
                                        SASL_AUTHENTICATION_FAILED, INVALID_TOKEN)  # fmt: skip


def test_a_message_after_the_error_was_answered_ends_the_login() -> None:
    login = Login(OAuthBearer("kafkatunnel", TOKEN))
    first = through_handshake(login)
    (reply,) = login.feed(answer(first, **authenticated(auth_bytes=INVALID_TOKEN.encode())))
    assert login.feed(answer(reply, **authenticated(auth_bytes=b"more"))) == []
    assert isinstance(login.outcome, LoginFailed) and login.outcome.error_code is None
    assert "after the conversation ended" in login.outcome.message


@pytest.mark.parametrize("token", ["", "two words", "a\x01b", "é", "x=y"])
def test_a_token_that_would_break_the_message_is_not_sent(token: str) -> None:
    mechanism = OAuthBearer("kafkatunnel", token)
    with pytest.raises(ValueError, match="not a bearer token"):
        mechanism.first()
    with pytest.raises(MechanismError):
        mechanism.answer(b"")


def test_the_token_shows_nowhere_but_in_the_message() -> None:
    mechanism = OAuthBearer("kafkatunnel", TOKEN)
    assert TOKEN not in repr(mechanism)
    assert repr(mechanism) == "OAuthBearer(OAUTHBEARER as 'kafkatunnel')"
