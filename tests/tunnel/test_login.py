"""The credentials the tunnel logs in with: held, never shown. (The login itself, on Apache
Kafka's own listeners: tests/apache/test_login.py.)"""

from __future__ import annotations

import pytest

from kafkatunnel.protocol import LoggedIn, Plain, Scram
from kafkatunnel.tunnel.forwarders import DirectForwarder
from kafkatunnel.tunnel.login import Credentials, LoginForwarder, SessionRenewal

pytestmark = pytest.mark.quick


def test_credentials_show_the_user_and_the_mechanism_never_the_password() -> None:
    credentials = Credentials("SCRAM-SHA-512", "alice", b"alice-s3cret", "--sasl-password-env P")
    assert "s3cret" not in repr(credentials) + str(credentials)
    assert "alice" in repr(credentials) and "SCRAM-SHA-512" in repr(credentials)


def test_each_connection_gets_a_conversation_of_its_own_sharing_the_derived_key() -> None:
    scram = Credentials("SCRAM-SHA-256", "alice", b"pw")
    first, second = scram.conversation(), scram.conversation()
    assert isinstance(first, Scram) and isinstance(second, Scram) and first is not second
    assert first.name == "SCRAM-SHA-256"
    assert first._salted is second._salted  # one derivation for all connections
    assert isinstance(Credentials("PLAIN", "alice", b"pw").conversation(), Plain)


def test_a_mechanism_the_tunnel_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="'GSSAPI' is not one of PLAIN, SCRAM-SHA-256"):
        Credentials("GSSAPI", "alice", b"pw")


@pytest.mark.parametrize("lifetime_ms", [0, 800, 3000, 3_600_000])
def test_a_session_is_renewed_within_85_to_95_percent_of_its_lifetime_and_a_second_apart(
    lifetime_ms: int,
) -> None:
    """As Kafka's own client: a share of the lifetime picked at random per login (so that
    connections opened together do not pause together), never less than the second the
    broker insists on between two logins; a session for the connection's life is never
    renewed."""
    forwarder = LoginForwarder(DirectForwarder(), Credentials("PLAIN", "alice", b"pw"))
    shares = set()
    for _ in range(50):
        renewal = SessionRenewal(
            forwarder, "kafka-0", 9092, LoggedIn("PLAIN", "alice", lifetime_ms)
        )
        due = renewal.due_in()
        if not lifetime_ms:
            assert due is None
            continue
        assert due is not None
        seconds = lifetime_ms / 1000
        assert max(0.85 * seconds, 1.0) - 0.1 <= due <= max(0.95 * seconds, 1.0)
        shares.add(round(due, 6))
    assert lifetime_ms in (0, 800) or len(shares) > 1  # not the same moment for every one
