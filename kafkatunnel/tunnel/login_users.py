"""Who may use the tunnel's login: the programs of the user it runs as, and root's.

A tunnel that logs in for its clients (--sasl-*, --kafka-user, a client certificate)
gives every connection it accepts the user's identity on the cluster. Its ports are open
to every user of the machine, so each connection from this machine is asked of the kernel
(tunnel/peer_user.py): one of another user's, or one whose user cannot be told (its
socket closed, or gone), is closed before anything of it reaches a broker. Root counts as
the user: root can read the user's secret and the tunnel's memory anyway, and `sudo` in
front of a client is common. Under sudo the tunnel runs as the user who ran it
(kafkatunnel.privileges), so that user is whom it serves.

A client of another machine or network namespace (a container on a bridge, through
--for-containers or a --listen beyond loopback) has no user this kernel knows: it is
served, and `up` says at start that whoever reaches such a listener is logged in."""

from __future__ import annotations

import os
import pwd
import socket
from dataclasses import dataclass

from kafkatunnel.tunnel.peer_user import Elsewhere, Ends, Owner, PeerUsers, Unavailable

ROOT = 0


@dataclass(frozen=True)
class Refusal:
    """A connection refused the login: the client's address, and why, in one line."""

    peer: str
    message: str


class LoginUsers:
    """The check of each accepted connection (only a tunnel that logs in has one), and
    the count of those refused. `login`: who the tunnel logs in as, for messages."""

    def __init__(self, login: str, owner: int | None = None) -> None:
        self.login = login
        self.owner = os.geteuid() if owner is None else owner
        self.refused = 0
        self.peers: PeerUsers | None = None
        self.unchecked: str | None = None  # why the kernel cannot be asked here
        try:
            self.peers = PeerUsers()
        except Unavailable as why:
            self.unchecked = str(why)
        except OSError as error:  # its own check's loopback connection failed
            self.unchecked = f"a loopback connection to check the lookup failed: {error}"

    @property
    def users(self) -> list[str]:
        """Whose programs may use the login, by name."""
        return [user_name(uid) for uid in dict.fromkeys((self.owner, ROOT))]

    @property
    def said(self) -> str:
        """One line for the start: who can use the login."""
        if self.unchecked is not None:
            return (f"every program on this machine that connects to the tunnel is logged in "
                    f"as {self.login}: which user a connection comes from cannot be told "
                    f"here ({self.unchecked})")  # fmt: skip
        return (f"the tunnel logs in as {self.login} for the programs of {self._whose} on "
                "this machine alone: other users' connections are refused")  # fmt: skip

    def elsewhere(self, host: str) -> str:
        """The warning for a listener beyond loopback: its clients are served unchecked."""
        return (f"a client that reaches {host} from another machine or a container is "
                f"logged in as {self.login}: no user of this machine's can be told for it "
                "(keep --listen on loopback, or let only those you trust with the login "
                "reach it)")  # fmt: skip

    @property
    def _whose(self) -> str:
        return " and ".join(self.users)

    def refusal(self, sock: socket.socket) -> Refusal | None:
        """Why the connection accepted on `sock` may not use the login (None: it may)."""
        if self.peers is None:
            return None
        try:
            peer, local = sock.getpeername()[:2], sock.getsockname()[:2]
        except OSError:  # reset before it was looked at: it sends nothing more either
            self.refused += 1
            return Refusal("?", "a client refused: its connection was reset before the "
                           "tunnel could ask whose it was")  # fmt: skip
        address = f"{peer[0]}:{peer[1]}"
        try:
            found = self.peers.user_of(Ends.of(peer, local))
        except (OSError, ValueError) as error:  # addresses it cannot ask about
            why = f"its addresses could not be asked about ({error})"
        else:
            if isinstance(found, Elsewhere):
                return None
            if isinstance(found, Owner):
                if found.uid in (self.owner, ROOT):
                    return None
                self.refused += 1
                other = user_name(found.uid)
                return Refusal(address, f"client {address} refused: it runs as {other}, and "
                               f"the tunnel logs in as {self.login} for the programs of "
                               f"{self._whose} alone ({other} can run a tunnel of their "
                               "own)")  # fmt: skip
            why = found.reason
        self.refused += 1
        return Refusal(address, f"client {address} refused: which user it runs as cannot be "
                       f"told ({why}), and the tunnel logs in as {self.login} for the "
                       f"programs of {self._whose} alone")  # fmt: skip

    def status(self) -> dict[str, object]:
        return {
            "users": None if self.unchecked is not None else self.users,
            "refused": self.refused,
            "unchecked": self.unchecked,
        }

    def close(self) -> None:
        if self.peers is not None:
            self.peers.close()


def user_name(uid: int) -> str:
    """`alice (uid 1000)`, or `uid 1000` for a uid without a name here."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
