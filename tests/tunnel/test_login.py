"""The credentials the tunnel logs in with: held, never shown. (The login itself, on Apache
Kafka's own listeners: tests/apache/test_login.py.)"""

from __future__ import annotations

import pytest

from kafkatunnel.protocol import Plain, Scram
from kafkatunnel.tunnel.login import Credentials

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
