"""Which user of this machine a client connection comes from (Linux), asked of the kernel.

The kernel keeps, with each socket, the user who made it. For a TCP connection accepted
from a program on this machine, the client's socket is in the tunnel's own network
namespace, and one netlink sock_diag request (inet_diag, NETLINK_SOCK_DIAG) looks up
exactly that socket by its two addresses and answers its user and inode: the same cost
whatever else the machine holds (reading /proc/net/tcp costs a row per socket on the
machine: see scripts/bench_peer_user.py). SO_PEERCRED would answer for a Unix socket, but
Kafka's clients speak TCP.

A socket whose program closed it answers with user 0 and inode 0 (the kernel keeps only a
minimal socket for FIN_WAIT2 and TIME_WAIT, and an orphan has no inode left): that is not
root's, it is nobody's any more, and is answered as Unknown. A socket not found at all is
either gone (its address is this machine's: Unknown again) or of another machine or
network namespace, a container's (Elsewhere): a second netlink request (rtnetlink, the
route to the address) says which.

The requests and answers are built and read by pure functions; PeerUsers does the I/O,
never waiting: the kernel answers a netlink request before the send returns."""

from __future__ import annotations

import errno
import ipaddress
import itertools
import os
import socket
import struct
from dataclasses import dataclass

Address = tuple[str, int]

# <linux/netlink.h>, <linux/sock_diag.h>, <linux/inet_diag.h>, <linux/rtnetlink.h>
NETLINK_ROUTE, NETLINK_SOCK_DIAG = 0, 4
NLM_F_REQUEST = 0x1
NLMSG_ERROR, NLMSG_DONE = 2, 3
SOCK_DIAG_BY_FAMILY = 20
RTM_NEWROUTE, RTM_GETROUTE = 24, 26
RTA_DST = 1
RTN_LOCAL = 2  # the route of an address of this machine's
NO_COOKIE = 0xFFFFFFFF  # INET_DIAG_NOCOOKIE: any socket with these addresses
ALL_STATES = 0xFFFFFFFF
TCP_LISTEN = 10

HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
DIAG_REQUEST = struct.Struct("=BBBBI")  # inet_diag_req_v2 before its inet_diag_sockid
PORTS = struct.Struct("!HH")  # the sockid's source and destination ports, network order
SOCKID_TAIL = struct.Struct("=III")  # the sockid's interface and cookie
DIAG_MESSAGE = struct.Struct("=BBBB")  # inet_diag_msg: family, state, timer, retransmits
DIAG_OWNER = struct.Struct("=IIIII")  # after the sockid: expires, queues, uid, inode
SOCKID_SIZE = PORTS.size + 16 + 16 + SOCKID_TAIL.size
ERROR = struct.Struct("=i")  # nlmsgerr: a negative errno
ROUTE_MESSAGE = struct.Struct("=BBBBBBBBI")  # rtmsg; rtm_type is its eighth byte
ATTRIBUTE = struct.Struct("=HH")  # rtattr: length, type


@dataclass(frozen=True)
class Owner:
    """The user who made the client's socket, which a program holds (by its inode)."""

    uid: int
    inode: int


@dataclass(frozen=True)
class Unknown:
    """A client on this machine whose user cannot be told; `reason` says why."""

    reason: str


@dataclass(frozen=True)
class Elsewhere:
    """A client of another machine or network namespace (a container on a bridge): the
    kernel of this one knows no user of it."""


Found = Owner | Unknown | Elsewhere


@dataclass(frozen=True)
class Ends:
    """An accepted TCP connection as the tunnel sees it: the client's address (`peer`)
    and the tunnel's own (`local`), IPv4 as IPv4 even when mapped into IPv6."""

    family: int
    peer: Address
    local: Address

    @classmethod
    def of(cls, peer: Address, local: Address) -> Ends:
        hosts = [_unmapped(peer[0]), _unmapped(local[0])]
        family = socket.AF_INET6 if any(":" in h for h in hosts) else socket.AF_INET
        return cls(family, (hosts[0], peer[1]), (hosts[1], local[1]))

    @property
    def peer_on_loopback(self) -> bool:
        return ipaddress.ip_address(self.peer[0]).is_loopback


def _unmapped(host: str) -> str:
    address = ipaddress.ip_address(host.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def _packed(family: int, host: str) -> bytes:
    return socket.inet_pton(family, host).ljust(16, b"\0")


def diag_request(ends: Ends, sequence: int) -> bytes:
    """The sock_diag request for the client's socket alone (no NLM_F_DUMP: the kernel
    looks it up by its addresses, its source being the client's)."""
    body = DIAG_REQUEST.pack(ends.family, socket.IPPROTO_TCP, 0, 0, ALL_STATES)
    body += PORTS.pack(ends.peer[1], ends.local[1])
    body += _packed(ends.family, ends.peer[0]) + _packed(ends.family, ends.local[0])
    body += SOCKID_TAIL.pack(0, NO_COOKIE, NO_COOKIE)
    return HEADER.pack(HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST,
                       sequence, 0) + body  # fmt: skip


def diag_answer(data: bytes, ends: Ends, sequence: int) -> Owner | Unknown | None:
    """What the kernel's answer to `diag_request` says of the client's socket; None: no
    such socket (or no answer to this request); Unknown: one that no program holds (it
    was closed), or an error."""
    for kind, payload in _messages(data, sequence):
        if kind == NLMSG_ERROR:
            code = -ERROR.unpack_from(payload)[0] if len(payload) >= ERROR.size else errno.EIO
            if code == errno.ENOENT:
                return None
            return Unknown(f"the kernel's socket lookup failed: {os.strerror(code)}")
        if kind != SOCK_DIAG_BY_FAMILY:
            continue
        if len(payload) < DIAG_MESSAGE.size + SOCKID_SIZE + DIAG_OWNER.size:
            return Unknown("the kernel's socket lookup answered too short a message")
        family, state, _, _ = DIAG_MESSAGE.unpack_from(payload)
        # A listener on the client's port matches too once the client's socket is gone:
        # only the socket with both addresses is the client's. (An IPv6 socket, Java's,
        # connected to an IPv4 address is answered with the addresses mapped.)
        if state == TCP_LISTEN or _answered_ends(family, payload) != ends:
            return None
        *_, uid, inode = DIAG_OWNER.unpack_from(payload, DIAG_MESSAGE.size + SOCKID_SIZE)
        if inode == 0:  # a minimal socket (FIN_WAIT2, TIME_WAIT) or an orphan: closed
            return Unknown("its program closed its socket already")
        return Owner(uid, inode)
    return None


def _answered_ends(family: int, payload: bytes) -> Ends | None:
    """The addresses an answer's socket has (source: the client's), as Ends."""
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    size = 4 if family == socket.AF_INET else 16
    sport, dport = PORTS.unpack_from(payload, DIAG_MESSAGE.size)
    start = DIAG_MESSAGE.size + PORTS.size
    source = socket.inet_ntop(family, payload[start : start + size])
    destination = socket.inet_ntop(family, payload[start + 16 : start + 16 + size])
    return Ends.of((source, sport), (destination, dport))


def route_request(family: int, host: str, sequence: int) -> bytes:
    """The rtnetlink request for the route to `host`: type RTN_LOCAL if it is this
    machine's address."""
    address = socket.inet_pton(family, host)
    body = ROUTE_MESSAGE.pack(family, len(address) * 8, 0, 0, 0, 0, 0, 0, 0)
    body += ATTRIBUTE.pack(ATTRIBUTE.size + len(address), RTA_DST) + address
    return HEADER.pack(HEADER.size + len(body), RTM_GETROUTE, NLM_F_REQUEST, sequence, 0) + body


def route_answer(data: bytes, sequence: int) -> bool | None:
    """Whether the answer to `route_request` names a route of this machine's own (None:
    no answer to it in `data`). No route at all: not this machine's."""
    for kind, payload in _messages(data, sequence):
        if kind == NLMSG_ERROR:
            return False
        if kind == RTM_NEWROUTE and len(payload) >= ROUTE_MESSAGE.size:
            return payload[7] == RTN_LOCAL
    return None


def _messages(data: bytes, sequence: int) -> list[tuple[int, bytes]]:
    """The netlink messages in one datagram that answer `sequence`: (type, payload)."""
    found, offset = [], 0
    while offset + HEADER.size <= len(data):
        length, kind, _, seq, _ = HEADER.unpack_from(data, offset)
        if length < HEADER.size or offset + length > len(data):
            break
        if seq == sequence and kind != NLMSG_DONE:
            found.append((kind, data[offset + HEADER.size : offset + length]))
        offset += (length + 3) & ~3  # NLMSG_ALIGN
    return found


class Unavailable(OSError):
    """The kernel cannot be asked whose a socket is here; the message says why."""


class PeerUsers:
    """The kernel's netlink sockets for the look-ups, opened once, and checked on a
    connection of this process's own: the answer must be its user and that socket's
    inode, or Unavailable says what failed."""

    def __init__(self) -> None:
        if not hasattr(socket, "AF_NETLINK"):
            raise Unavailable("this system has no netlink sock_diag (it is not Linux)")
        self._sequence = itertools.count(1)
        self._sockets: list[socket.socket] = []
        try:
            self._diag = self._open(NETLINK_SOCK_DIAG, "sock_diag")
            self._route = self._open(NETLINK_ROUTE, "route")
            self._check()
        except BaseException:
            self.close()
            raise

    def _open(self, protocol: int, name: str) -> socket.socket:
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, protocol)
        except OSError as error:
            raise Unavailable(f"no netlink {name} socket: {error.strerror}") from None
        self._sockets.append(sock)
        return sock

    def _check(self) -> None:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            with socket.socket() as client:
                client.connect(listener.getsockname())
                accepted, peer = listener.accept()
                with accepted:
                    found = self.user_of(Ends.of(peer, accepted.getsockname()))
                expected = Owner(os.geteuid(), os.fstat(client.fileno()).st_ino)
        if found != expected:
            raise Unavailable(f"the kernel's socket lookup answered {found} for a socket "
                              f"of this process's own, not {expected}")  # fmt: skip

    def user_of(self, ends: Ends) -> Found:
        """Whose the client's socket is: Owner, Unknown (a client of this machine whose
        user cannot be told), or Elsewhere."""
        sequence = self._next()
        answer = self._ask(self._diag, diag_request(ends, sequence), sequence)
        if answer is None:
            return Unknown("the kernel did not answer the socket lookup")
        found = diag_answer(answer, ends, sequence)
        if found is not None:
            return found
        gone = Unknown("no socket has its address any more (it was reset)")
        if ends.peer_on_loopback:
            return gone
        sequence = self._next()
        answer = self._ask(self._route, route_request(ends.family, ends.peer[0], sequence),
                           sequence)  # fmt: skip
        local = None if answer is None else route_answer(answer, sequence)
        if local is None:
            return Unknown("the kernel did not answer the route lookup")
        return gone if local else Elsewhere()

    def _next(self) -> int:
        return next(self._sequence) & 0xFFFFFFFF

    @staticmethod
    def _ask(sock: socket.socket, request: bytes, sequence: int) -> bytes | None:
        """The answer the kernel queued while taking `request`, past any left from an
        earlier one (None: none came)."""
        try:
            sock.send(request)
            while True:
                answer = sock.recv(1 << 16, socket.MSG_DONTWAIT)
                if _messages(answer, sequence):
                    return answer
        except OSError:  # BlockingIOError among them: nothing (more) queued
            return None

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()
