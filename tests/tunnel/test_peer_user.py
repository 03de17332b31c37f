"""Whose a client connection is, asked of this machine's kernel: the netlink requests and
answers as bytes (sans-I/O), then real sockets of this process's and of another user's."""

from __future__ import annotations

import errno
import os
import random
import socket
import struct
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kafkatunnel.tunnel.peer_user import (
    DIAG_MESSAGE,
    DIAG_OWNER,
    ERROR,
    HEADER,
    NLMSG_DONE,
    NLMSG_ERROR,
    PORTS,
    ROUTE_MESSAGE,
    RTM_NEWROUTE,
    RTN_LOCAL,
    SOCK_DIAG_BY_FAMILY,
    SOCKID_TAIL,
    TCP_LISTEN,
    Elsewhere,
    Ends,
    Owner,
    PeerUsers,
    Unknown,
    diag_answer,
    diag_request,
    route_answer,
    route_request,
)

NOBODY = 65534
ESTABLISHED = 1
ENDS = Ends.of(("127.0.0.1", 40000), ("127.0.0.1", 9092))


def message(kind: int, payload: bytes, sequence: int = 7) -> bytes:
    padded = payload + b"\0" * (-len(payload) % 4)
    return HEADER.pack(HEADER.size + len(payload), kind, 0, sequence, 0) + padded


def diag_payload(ends: Ends, uid: int, inode: int, state: int = ESTABLISHED) -> bytes:
    """An inet_diag_msg as the kernel writes it for a socket with these addresses."""
    packed = [
        socket.inet_pton(ends.family, h).ljust(16, b"\0") for h in (ends.peer[0], ends.local[0])
    ]
    return (DIAG_MESSAGE.pack(ends.family, state, 0, 0) + PORTS.pack(ends.peer[1], ends.local[1])
            + packed[0] + packed[1] + SOCKID_TAIL.pack(0, 1, 2)
            + DIAG_OWNER.pack(0, 0, 0, uid, inode))  # fmt: skip


@pytest.mark.quick
def test_the_request_names_the_clients_socket_by_both_addresses() -> None:
    request = diag_request(ENDS, 7)
    length, kind, flags, sequence, _ = HEADER.unpack_from(request)
    assert (length, kind, flags, sequence) == (len(request), SOCK_DIAG_BY_FAMILY, 1, 7)
    body = request[HEADER.size :]
    assert body[0] == socket.AF_INET and body[1] == socket.IPPROTO_TCP
    assert PORTS.unpack_from(body, 8) == (40000, 9092)  # the client's port first
    assert body[12:16] == socket.inet_aton("127.0.0.1") == body[28:32]


@pytest.mark.quick
def test_an_answer_of_the_clients_socket_says_its_user_and_inode() -> None:
    answer = message(SOCK_DIAG_BY_FAMILY, diag_payload(ENDS, 1000, 4242))
    assert diag_answer(answer, ENDS, 7) == Owner(1000, 4242)


@pytest.mark.quick
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (message(NLMSG_ERROR, ERROR.pack(-errno.ENOENT)), None),  # no such socket
        (
            message(NLMSG_ERROR, ERROR.pack(-errno.EPERM)),
            Unknown("the kernel's socket lookup failed: Operation not permitted"),
        ),
        (
            message(NLMSG_ERROR, b""),
            Unknown("the kernel's socket lookup failed: Input/output error"),
        ),
        (
            message(SOCK_DIAG_BY_FAMILY, b"\x02\x01"),
            Unknown("the kernel's socket lookup answered too short a message"),
        ),
        # the listener on the port is not the client
        (message(SOCK_DIAG_BY_FAMILY, diag_payload(ENDS, 0, 9, TCP_LISTEN)), None),
        # another socket's addresses
        (
            message(
                SOCK_DIAG_BY_FAMILY,
                diag_payload(Ends.of(("127.0.0.1", 40001), ("127.0.0.1", 9092)), 0, 9),
            ),
            None,
        ),
        # closed by its program: a minimal socket, no inode, "uid 0" that is nobody's
        (
            message(SOCK_DIAG_BY_FAMILY, diag_payload(ENDS, 0, 0)),
            Unknown("its program closed its socket already"),
        ),
        (message(SOCK_DIAG_BY_FAMILY, diag_payload(ENDS, 5, 5), sequence=6), None),  # not ours
        (message(NLMSG_DONE, b""), None),
        (b"", None),
    ],
)
def test_answers_that_name_no_owner(answer: bytes, expected: Unknown | None) -> None:
    assert diag_answer(answer, ENDS, 7) == expected


@pytest.mark.quick
def test_an_ipv6_socket_connected_to_an_ipv4_address_is_the_same_client() -> None:
    """Java's sockets are IPv6 ones: the kernel answers with the addresses mapped."""
    mapped = Ends(socket.AF_INET6, ("::ffff:127.0.0.1", 40000), ("::ffff:127.0.0.1", 9092))
    answer = message(SOCK_DIAG_BY_FAMILY, diag_payload(mapped, 1000, 1))
    assert diag_answer(answer, ENDS, 7) == Owner(1000, 1)
    assert Ends.of(("::ffff:127.0.0.1", 40000), ("::ffff:127.0.0.1", 9092)) == ENDS


@pytest.mark.quick
def test_a_route_answer_says_whether_the_address_is_this_machines() -> None:
    request = route_request(socket.AF_INET, "172.17.0.2", 3)
    assert HEADER.unpack_from(request)[1] == 26 and request.endswith(socket.inet_aton("172.17.0.2"))

    def route(kind: int) -> bytes:
        return message(RTM_NEWROUTE, ROUTE_MESSAGE.pack(2, 32, 0, 0, 254, 0, 0, kind, 0), 3)

    assert route_answer(route(RTN_LOCAL), 3) is True
    assert route_answer(route(1), 3) is False  # unicast: through an interface, elsewhere
    assert route_answer(message(NLMSG_ERROR, ERROR.pack(-errno.ENETUNREACH), 3), 3) is False
    assert route_answer(route(RTN_LOCAL)[:-4], 4) is None


@pytest.mark.quick
def test_garbage_from_the_kernel_is_never_an_owner_nor_an_exception() -> None:
    """Whatever bytes come back, the answer is None, Unknown or False, never a crash."""
    rng = random.Random(63)
    good = message(SOCK_DIAG_BY_FAMILY, diag_payload(ENDS, 1000, 4242))
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = data[: rng.randint(0, len(data))]
        found = diag_answer(bytes(data), ENDS, 7)
        assert found is None or isinstance(found, (Unknown, Owner))
        if isinstance(found, Owner):  # intact where it matters: the very socket
            assert (bytes(data[20:28]), bytes(data[40:44])) == (good[20:28], good[40:44])
        assert route_answer(bytes(data), 7) in (None, True, False)
    for length in (0, 1, 15, 16, 2**32 - 1):
        assert diag_answer(struct.pack("=I", length) + bytes(12), ENDS, 0) is None


# -- the kernel's own answers ------------------------------------------------------------------


@pytest.fixture(scope="module")
def peers() -> Iterator[PeerUsers]:
    users = PeerUsers()  # checks itself on a connection of this process's
    try:
        yield users
    finally:
        users.close()


@contextmanager
def listener(host: str = "127.0.0.1") -> Iterator[socket.socket]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        sock.listen(8)
        yield sock


@contextmanager
def client_of(user: int, address: tuple[str, int]) -> Iterator[subprocess.Popen[bytes]]:
    """socat run as `user`, connected to `address`, holding its socket until it ends."""
    process = subprocess.Popen(["socat", "-u", "STDIN", f"TCP:{address[0]}:{address[1]}"],
                               stdin=subprocess.PIPE, user=user, group=user,
                               extra_groups=[], cwd="/")  # fmt: skip
    try:
        yield process
    finally:
        process.kill()
        process.wait(10)


def accepted_ends(server: socket.socket) -> tuple[socket.socket, Ends]:
    server.settimeout(10)
    accepted, peer = server.accept()
    return accepted, Ends.of(peer, accepted.getsockname())


@pytest.mark.skipif(os.geteuid() != 0, reason="a program of another user's needs root")
def test_another_users_client_is_told_by_its_uid(peers: PeerUsers) -> None:
    with listener() as server, client_of(NOBODY, server.getsockname()):
        accepted, ends = accepted_ends(server)
        with accepted:
            found = peers.user_of(ends)
    assert isinstance(found, Owner) and found.uid == NOBODY


def test_a_client_of_this_process_over_ipv6_loopback(peers: PeerUsers) -> None:
    with listener("::1") as server, socket.create_connection(server.getsockname()[:2]) as client:
        accepted, ends = accepted_ends(server)
        with accepted:
            found = peers.user_of(ends)
        assert found == Owner(os.geteuid(), os.fstat(client.fileno()).st_ino)


def test_a_client_to_a_dual_stack_listener_is_found_by_its_ipv4_address(
    peers: PeerUsers,
) -> None:
    with socket.socket(socket.AF_INET6) as server:
        server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        server.bind(("::", 0))
        server.listen(1)
        with socket.create_connection(("127.0.0.1", server.getsockname()[1])) as client:
            accepted, ends = accepted_ends(server)
            with accepted:
                assert ends.family == socket.AF_INET  # unmapped
                found = peers.user_of(ends)
            assert found == Owner(os.geteuid(), os.fstat(client.fileno()).st_ino)


def test_a_client_that_closed_its_socket_is_nobodys(peers: PeerUsers) -> None:
    with listener() as server:
        client = socket.create_connection(server.getsockname())
        accepted, ends = accepted_ends(server)
        client.close()  # FIN_WAIT2 on its side: a socket no program holds
        with accepted:
            found = peers.user_of(ends)
    assert isinstance(found, Unknown), found


def test_a_client_that_was_reset_is_gone(peers: PeerUsers) -> None:
    with listener() as server:
        client = socket.create_connection(server.getsockname())
        accepted, ends = accepted_ends(server)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # RST: no socket with its address is left
        with accepted:
            found = peers.user_of(ends)
    assert found == Unknown("no socket has its address any more (it was reset)")


def test_an_address_of_another_machine_is_elsewhere(peers: PeerUsers) -> None:
    """No socket of this kernel's has it, and no route says it is this machine's (the
    address of TEST-NET-1, documentation's)."""
    assert peers.user_of(Ends.of(("192.0.2.7", 40000), ("127.0.0.1", 9092))) == Elsewhere()
    found = peers.user_of(Ends.of(("127.0.0.9", 40000), ("127.0.0.1", 9092)))
    assert isinstance(found, Unknown)  # loopback is this machine: gone, never elsewhere
