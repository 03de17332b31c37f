"""How to reach an advertised broker address: the one thing that differs between a VPN, a
bastion host and a Kubernetes cluster. The tunnel only sees this interface.

- `direct`: plain TCP, to a mapped address (`--map ADVERTISED=REACHABLE`) or the advertised one.
- `exec`: one process per upstream connection whose stdin/stdout is the byte stream, like
  ssh's ProxyCommand: `ssh bastion nc {host} {port}`, or
  `ip netns exec NS socat STDIO TCP:{host}:{port}`. The template is split into words
  first, as a shell would (no shell runs it), and each placeholder filled inside its word,
  so a broker's name is never more than part of one argument.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import socket
import string
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import cast

from kafkatunnel.hostnames import split_address
from kafkatunnel.pids import die_with_parent
from kafkatunnel.tunnel.streams import READ_SIZE, ByteStream, PlainStream


class ForwarderError(Exception):
    """The forwarder could not open a stream; the message says why and what to do.

    `permanent`: asking again will not help (a refusal by RBAC, not a forward restarting)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


# When (the event loop's clock) the stream being opened must be ready, set by whoever opens
# it (a client connection, by --connect-timeout) and read by each step of the open (a TLS
# handshake, a login, a token): the step that runs out of time says so, not the caller's
# bound around them all. A task made while it is set keeps it (asyncio copies the context).
OPEN_DEADLINE: ContextVar[float | None] = ContextVar("kafkatunnel_open_deadline", default=None)


def time_left(bound: float) -> float:
    """Seconds a step of an open may take: its own `bound`, or less when the open's
    deadline (OPEN_DEADLINE) comes first."""
    deadline = OPEN_DEADLINE.get()
    if deadline is None:
        return bound
    return max(0.0, min(bound, deadline - asyncio.get_running_loop().time()))


class NoAnswer(ForwarderError):
    """A stream opened, and nothing answered on it in time (a TLS handshake, a login): as
    through a forward that died, so the forward is worth checking."""


class Reauthentication(ABC):
    """A login whose session the broker ends after a while (KIP-368): the stream that
    carries it must log in again before then, or the broker closes it."""

    @abstractmethod
    def due_in(self) -> float | None:
        """Seconds until the login is to be done again (None: never)."""

    @abstractmethod
    async def again(self, upstream: Upstream) -> None:
        """Log in again on `upstream`, which carries nothing else meanwhile. ForwarderError
        if the broker refuses (the message says why) or the stream fails."""


class Upstream(ABC):
    """A byte stream to one broker: descriptors (one socket for TCP; a process's stdout and
    stdin for exec), and the stream the relay reads and writes over them."""

    read_fd: int
    write_fd: int
    on_gone: Callable[[], None] | None = None  # the far end went away without an EOF
    refused = False  # the far end refused this client for good (a TLS alert): no retry helps
    reauthentication: Reauthentication | None = None  # the stream's login, to be done again
    _stream: ByteStream | None = None

    @property
    def stream(self) -> ByteStream:
        """The bytes as the relay reads and writes them (the descriptors' own, unless a
        subclass says otherwise), made once, in the event loop."""
        if self._stream is None:
            self._stream = PlainStream(self.read_fd, self.write_fd)
        return self._stream

    @abstractmethod
    def close(self) -> None:
        """End the stream (readers of read_fd then see its end); safe while it is watched."""

    def end(self) -> None:
        """End the stream once nothing watches it, letting the far end take what was written
        (a connection's end: its last request still goes). By default, as close does."""
        self.close()

    @abstractmethod
    def release(self) -> None:
        """Close the descriptors, once nothing watches them any more."""

    @abstractmethod
    async def wait_closed(self) -> None:
        """Until whatever carried the stream is gone (a process reaped, a socket closed)."""

    async def discard(self, wait: float = 2.0) -> None:
        """Close and release it, then wait (a bounded while) until what carried it is gone:
        a process is reaped before its event loop may close."""
        self.close()
        self.release()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wait_closed(), wait)

    async def why_ended(self, error: OSError | None) -> str | None:
        """Why the stream ended (None: a plain close), given what reading it gave."""
        return None if error is None else f"connection to the broker lost: {error.strerror}"

    async def send(self, data: bytes) -> None:
        """All of data into the stream (outside the relay: probes and discovery)."""
        await self.stream.send(data)

    async def receive(self, size: int = READ_SIZE) -> bytes:
        """What the stream has, once it has something (b"": it ended)."""
        return await self.stream.receive(size)


class Forwarder(ABC):
    kind: str

    @abstractmethod
    async def open(self, host: str, port: int) -> Upstream:
        """Open a stream to the advertised broker address host:port."""

    @abstractmethod
    def describe(self, host: str, port: int) -> str:
        """How host:port is reached, for the live table."""

    def restarts(self, host: str, port: int) -> int:
        """How often the forward to host:port was restarted (forwards that are processes)."""
        return 0

    def session(self, host: str, port: int) -> dict[str, object] | None:
        """The last TLS session with host:port, for status (None: none, or no TLS)."""
        return None

    def replacements(self, host: str, port: int) -> int:
        """How often a forward to host:port that was alive but useless was replaced."""
        return 0

    def suspect(self, host: str, port: int, signal: str) -> None:  # noqa: B027 - optional hook
        """A connection to host:port behaved as through a dead forward (closed before any
        byte, or no answer in time): check the forward, if there is one to check."""

    def expect(self, host: str, port: int) -> None:  # noqa: B027 - optional hook
        """A broker at host:port exists: get ready to reach it before a client asks."""

    async def prepare(self) -> None:  # noqa: B027 - optional hook
        """Check what the forwarder needs before the tunnel starts (fail early, clearly)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the forwarder holds (processes it supervises)."""


class WrappingForwarder(Forwarder):
    """A forwarder that adds something to each stream another one opens (TLS, a login):
    everything else is the inner forwarder's."""

    def __init__(self, inner: Forwarder) -> None:
        self.inner = inner
        self.kind = inner.kind

    def describe(self, host: str, port: int) -> str:
        return self.inner.describe(host, port)

    def session(self, host: str, port: int) -> dict[str, object] | None:
        return self.inner.session(host, port)

    def restarts(self, host: str, port: int) -> int:
        return self.inner.restarts(host, port)

    def replacements(self, host: str, port: int) -> int:
        return self.inner.replacements(host, port)

    def suspect(self, host: str, port: int, signal: str) -> None:
        self.inner.suspect(host, port, signal)

    def expect(self, host: str, port: int) -> None:
        self.inner.expect(host, port)

    async def prepare(self) -> None:
        await self.inner.prepare()

    async def close(self) -> None:
        await self.inner.close()


# -- direct ---------------------------------------------------------------------------------


class TcpUpstream(Upstream):
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.read_fd = self.write_fd = sock.fileno()
        self._released = asyncio.Event()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        self.sock.close()
        self._released.set()

    async def wait_closed(self) -> None:
        await self._released.wait()


async def connect_tcp(host: str, port: int) -> socket.socket:
    """A connected, non-blocking TCP socket without Nagle's delay (every address of host
    tried in turn, as asyncio's create_connection does)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    last: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except OSError as error:
            sock.close()
            last = error
            continue
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise last


def parse_mapping(entries: list[str]) -> dict[tuple[str, int], tuple[str, int]]:
    """`--map ADVERTISED_HOST:PORT=REACHABLE_HOST:PORT` entries, checked."""
    mapping = {}
    for entry in entries:
        advertised, sep, reachable = entry.partition("=")
        if not sep:
            raise ValueError(
                f"--map {entry!r}: expected ADVERTISED_HOST:PORT=REACHABLE_HOST:PORT, "
                "e.g. --map kafka-0.kafka:9092=10.0.0.5:31092"
            )
        try:
            mapping[split_address(advertised)] = split_address(reachable)
        except ValueError as error:
            raise ValueError(f"--map {entry!r}: {error}") from None
    return mapping


class DirectForwarder(Forwarder):
    kind = "direct"

    def __init__(self, mapping: Mapping[tuple[str, int], tuple[str, int]] | None = None) -> None:
        self.mapping = dict(mapping or {})

    def target(self, host: str, port: int) -> tuple[str, int]:
        return self.mapping.get((host, port), (host, port))

    def describe(self, host: str, port: int) -> str:
        target_host, target_port = self.target(host, port)
        return f"tcp {target_host}:{target_port}"

    async def open(self, host: str, port: int) -> Upstream:
        target_host, target_port = self.target(host, port)
        try:
            return TcpUpstream(await connect_tcp(target_host, target_port))
        except OSError as error:
            hint = "" if (host, port) in self.mapping else f" (add --map {host}:{port}=HOST:PORT)"
            cause = os.strerror(error.errno) if error.errno else str(error)
            raise ForwarderError(
                f"cannot connect to {target_host}:{target_port}: {cause}{hint}"
            ) from None


# -- exec -----------------------------------------------------------------------------------

PLACEHOLDERS = {"host", "port"}


def check_template(template: str) -> None:
    """Refuse a template that names anything but {host} and {port}, misses {port}, or
    would run a placeholder as the command. Placeholders are read word by word, as filled."""
    try:
        words = shlex.split(template)
    except ValueError as error:
        raise ValueError(f"--exec {template!r}: {error} (close the quote)") from None
    if not words:
        raise ValueError("--exec is empty")
    names: set[str] = set()
    for word in words:
        try:
            names |= {n for _, n, _, _ in string.Formatter().parse(word) if n is not None}
        except ValueError as error:
            raise ValueError(
                f"--exec {template!r}: {error} (write a literal brace as {{{{)"
            ) from None
    unknown = names - PLACEHOLDERS
    if unknown:
        raise ValueError(
            f"--exec {template!r} uses {', '.join('{' + n + '}' for n in sorted(unknown))}; "
            "only {host} and {port} are filled in"
        )
    if "port" not in names:
        raise ValueError(
            f"--exec {template!r} has no {{port}}: every broker would get the same stream. "
            'Example: --exec "ssh bastion nc {host} {port}"'
        )
    if "{" in words[0].replace("{{", ""):
        raise ValueError(f"--exec {template!r}: the command itself cannot be a placeholder")


class _ExecUpstream(asyncio.SubprocessProtocol, Upstream):
    """A process whose stdout and stdin the relay reads and writes directly (pipes we made,
    so that no transport owns them); its stderr and exit status say why it ended."""

    def __init__(self, argv: list[str], read_fd: int, write_fd: int) -> None:
        self.argv = argv
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.transport: asyncio.SubprocessTransport | None = None
        self.stderr = bytearray()
        self._exited = asyncio.Event()
        self._released = False
        self._stdin_ended = False  # write_fd is closed (see end)
        self._kill: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.SubprocessTransport, transport)

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.stderr += data
        del self.stderr[:-4096]

    def process_exited(self) -> None:
        self._exited.set()
        if self._kill is not None:
            self._kill.cancel()
        if self.on_gone is not None:  # its stdout may live on in a child it left behind
            self.on_gone()
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self) -> None:
        await self._exited.wait()

    async def why_ended(self, error: OSError | None) -> str | None:
        with contextlib.suppress(TimeoutError):  # stdout ends first: wait for the status
            await asyncio.wait_for(self._exited.wait(), EXIT_STATUS_WAIT)
        code = None if self.transport is None else self.transport.get_returncode()
        if code in (0, None) and not self.stderr:
            return None if error is None else f"`{self.argv[0]}` stream failed: {error.strerror}"
        detail = self.stderr.decode(errors="replace").strip().splitlines()
        tail = detail[-1] if detail else "no output"
        return f"`{shlex.join(self.argv)}` exited with {code}: {tail}"

    def close(self) -> None:
        # Kill, but close the transport only once the child is reaped (process_exited):
        # a transport closed earlier abandons its Popen, and subprocess's clean-up of
        # abandoned Popens would then reap the child behind asyncio's child watcher.
        if self.transport is not None and not self._exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                self.transport.kill()

    def end(self) -> None:
        """Let the command take all it was sent before it goes: killed at once, it would
        take the bytes still in its stdin pipe along (a client's last request). Its stdin
        ends instead, so it reads to the end and goes as a pipeline's command does; it is
        killed if it has not gone within ENDING."""
        if not self._stdin_ended:
            self._stdin_ended = True
            os.close(self.write_fd)
        if self.transport is not None and not self._exited.is_set() and self._kill is None:
            self._kill = asyncio.get_running_loop().call_later(ENDING, self.close)

    def release(self) -> None:
        if not self._released:
            self._released = True
            os.close(self.read_fd)
            if not self._stdin_ended:
                os.close(self.write_fd)


EXIT_STATUS_WAIT = 2.0  # after its stdout ended, how long to wait for a process's status
ENDING = 2.0  # how long an ended command may take to pass on what it was sent, and go


class ExecForwarder(Forwarder):
    kind = "exec"

    def __init__(self, template: str) -> None:
        check_template(template)
        self.template = template

    def argv(self, host: str, port: int) -> list[str]:
        """The command for host:port: the template's words, each filled in on its own (the
        tunnel has checked host already; this keeps even an unchecked one to one word)."""
        return [word.format(host=host, port=port) for word in shlex.split(self.template)]

    def describe(self, host: str, port: int) -> str:
        return f"exec {shlex.join(self.argv(host, port))}"

    async def open(self, host: str, port: int) -> Upstream:
        argv = self.argv(host, port)
        loop = asyncio.get_running_loop()
        stdin, to_child = os.pipe()
        from_child, stdout = os.pipe()
        try:
            _, upstream = await loop.subprocess_exec(
                lambda: _ExecUpstream(argv, from_child, to_child),
                *argv,
                stdin=stdin,
                stdout=stdout,
                stderr=asyncio.subprocess.PIPE,
                preexec_fn=die_with_parent,
            )
        except OSError as error:
            os.close(from_child)
            os.close(to_child)
            raise ForwarderError(
                f"cannot run `{argv[0]}` for --exec: {error.strerror or error}"
            ) from None
        finally:
            os.close(stdin)  # the child's ends: ours would keep its stdin from ending
            os.close(stdout)
        os.set_blocking(from_child, False)
        os.set_blocking(to_child, False)
        return upstream
