"""Who may use the tunnel's login: its user's programs and root's, on real sockets of this
machine (another user's program is socat run as nobody)."""

from __future__ import annotations

import os
import socket

import pytest

from kafkatunnel.tunnel.login_users import LoginUsers, user_name
from tests.tunnel.test_peer_user import NOBODY, client_of, listener

LOGIN = "alice (SCRAM-SHA-512)"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a program of another user's "
                                "needs root")  # fmt: skip


def refusal_of(users: LoginUsers, user: int | None) -> object:
    """What `users` says of a connection from a program of `user`'s (None: this process)."""
    with listener() as server:
        server.settimeout(10)
        if user is None:
            with socket.create_connection(server.getsockname()):
                accepted, _ = server.accept()
                with accepted:
                    return users.refusal(accepted)
        with client_of(user, server.getsockname()):
            accepted, _ = server.accept()
            with accepted:
                return users.refusal(accepted)


def test_the_owners_clients_and_roots_use_the_login_another_users_are_refused() -> None:
    users = LoginUsers(LOGIN, owner=NOBODY)  # a tunnel run by nobody
    try:
        assert users.unchecked is None
        assert refusal_of(users, NOBODY) is None
        assert refusal_of(users, None) is None  # root's (this process's)
        assert users.refused == 0
    finally:
        users.close()
    users = LoginUsers(LOGIN, owner=0)  # a tunnel run by root
    try:
        refusal = refusal_of(users, NOBODY)
        assert refusal is not None and users.refused == 1
        assert f"runs as {user_name(NOBODY)}" in refusal.message  # type: ignore[attr-defined]
        assert LOGIN in refusal.message  # type: ignore[attr-defined]
        assert users.status() == {"users": [user_name(0)], "refused": 1, "unchecked": None}
    finally:
        users.close()


def test_the_start_says_whose_programs_the_login_serves() -> None:
    users = LoginUsers(LOGIN, owner=NOBODY)
    try:
        said = users.said
    finally:
        users.close()
    assert said == (f"the tunnel logs in as {LOGIN} for the programs of {user_name(NOBODY)} "
                    f"and {user_name(0)} on this machine alone: other users' connections are "
                    "refused")  # fmt: skip
