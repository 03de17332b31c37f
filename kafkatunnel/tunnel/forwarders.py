"""How to reach an advertised broker address: the one thing that differs between a VPN, a
bastion host and a Kubernetes cluster. The tunnel only sees this interface.

- `direct`: plain TCP, to a mapped address (`--map ADVERTISED=REACHABLE`) or the advertised one.
- `exec`: one process per upstream connection whose stdin/stdout is the byte stream, like
  ssh's ProxyCommand: `ssh bastion nc {host} {port}`, or
  `ip netns exec NS socat STDIO TCP:{host}:{port}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import string
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Protocol, cast

from kafkatunnel.pids import die_with_parent
from kafkatunnel.probe import split_address

Buffer = bytes | bytearray | memoryview

# Producers send requests of up to ~1 MiB and brokers answer fetches with as much: with
# asyncio's 64 KiB default, every such frame would pause and resume the other side many times.
WRITE_BUFFER_HIGH = 4 << 20
WRITE_BUFFER_LOW = 1 << 20


class ForwarderError(Exception):
    """The forwarder could not open a stream; the message says why and what to do."""


class Downstream(Protocol):
    """The client side of a proxied connection, fed by the upstream."""

    def upstream_data(self, data: bytes) -> None: ...
    def upstream_lost(self, reason: str | None) -> None: ...
    def upstream_pause_writing(self) -> None: ...
    def upstream_resume_writing(self) -> None: ...


class Upstream(ABC):
    """A byte stream to one broker."""

    @abstractmethod
    def write(self, data: Buffer) -> None: ...
    @abstractmethod
    def pause_reading(self) -> None: ...
    @abstractmethod
    def resume_reading(self) -> None: ...
    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    async def wait_closed(self) -> None:
        """Until whatever carried the stream is gone (a process reaped, a socket closed)."""


class Forwarder(ABC):
    kind: str

    @abstractmethod
    async def open(self, host: str, port: int, downstream: Downstream) -> Upstream:
        """Open a stream to the advertised broker address host:port."""

    @abstractmethod
    def describe(self, host: str, port: int) -> str:
        """How host:port is reached, for the live table."""

    def restarts(self, host: str, port: int) -> int:
        """How often the forward to host:port was restarted (forwards that are processes)."""
        return 0

    def expect(self, host: str, port: int) -> None:  # noqa: B027 - optional hook
        """A broker at host:port exists: get ready to reach it before a client asks."""

    async def prepare(self) -> None:  # noqa: B027 - optional hook
        """Check what the forwarder needs before the tunnel starts (fail early, clearly)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the forwarder holds (processes it supervises)."""


# -- direct ---------------------------------------------------------------------------------


class _TcpUpstream(asyncio.Protocol, Upstream):
    def __init__(self, downstream: Downstream) -> None:
        self.downstream = downstream
        self.transport: asyncio.Transport | None = None
        self._closed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)

    def data_received(self, data: bytes) -> None:
        self.downstream.upstream_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed.set()
        self.downstream.upstream_lost(
            None if exc is None else f"connection to the broker lost: {exc}"
        )

    def pause_writing(self) -> None:
        self.downstream.upstream_pause_writing()

    def resume_writing(self) -> None:
        self.downstream.upstream_resume_writing()

    def write(self, data: Buffer) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def pause_reading(self) -> None:
        if self.transport is not None and self.transport.is_reading():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_reading():
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self) -> None:
        await self._closed.wait()


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

    async def open(self, host: str, port: int, downstream: Downstream) -> Upstream:
        target_host, target_port = self.target(host, port)
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.create_connection(
                lambda: _TcpUpstream(downstream), target_host, target_port
            )
        except OSError as error:
            hint = "" if (host, port) in self.mapping else f" (add --map {host}:{port}=HOST:PORT)"
            raise ForwarderError(
                f"cannot connect to {target_host}:{target_port}: {error.strerror or error}{hint}"
            ) from None
        return protocol


# -- exec -----------------------------------------------------------------------------------

PLACEHOLDERS = {"host", "port"}


def check_template(template: str) -> None:
    """Refuse a template that names anything but {host} and {port}, or misses {port}."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as error:
        raise ValueError(f"--exec {template!r}: {error} (write a literal brace as {{{{)") from None
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
    if not shlex.split(template):
        raise ValueError("--exec is empty")


class _ExecUpstream(asyncio.SubprocessProtocol, Upstream):
    def __init__(self, downstream: Downstream, argv: list[str]) -> None:
        self.downstream = downstream
        self.argv = argv
        self.transport: asyncio.SubprocessTransport | None = None
        self.stderr = bytearray()
        self._lost = False
        self._exited = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.SubprocessTransport, transport)

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self.downstream.upstream_data(data)
        else:
            self.stderr += data
            del self.stderr[:-4096]

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self._report_lost()

    def process_exited(self) -> None:
        self._exited.set()
        self._report_lost()
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self) -> None:
        await self._exited.wait()

    def _report_lost(self) -> None:
        if self._lost or self.transport is None:
            return
        code = self.transport.get_returncode()
        if code is None and not self.stderr:
            # stdout closed first; wait for the exit status to say why
            return
        self._lost = True
        reason = None
        if code not in (0, None) or self.stderr:
            detail = self.stderr.decode(errors="replace").strip().splitlines()
            tail = detail[-1] if detail else "no output"
            reason = f"`{shlex.join(self.argv)}` exited with {code}: {tail}"
        self.downstream.upstream_lost(reason)

    def _stdin(self) -> asyncio.WriteTransport | None:
        if self.transport is None:
            return None
        pipe = self.transport.get_pipe_transport(0)
        return cast(asyncio.WriteTransport | None, pipe)

    def write(self, data: Buffer) -> None:
        stdin = self._stdin()
        if stdin is not None and not stdin.is_closing():
            stdin.write(data)

    def pause_reading(self) -> None:
        if self.transport is not None:
            pipe = cast(asyncio.ReadTransport | None, self.transport.get_pipe_transport(1))
            if pipe is not None and pipe.is_reading():
                pipe.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None:
            pipe = cast(asyncio.ReadTransport | None, self.transport.get_pipe_transport(1))
            if pipe is not None and not pipe.is_reading():
                pipe.resume_reading()

    def close(self) -> None:
        # Kill, but close the transport only once the child is reaped (process_exited):
        # a transport closed earlier abandons its Popen, and subprocess's clean-up of
        # abandoned Popens would then reap the child behind asyncio's child watcher.
        if self.transport is not None and not self._exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                self.transport.kill()


class ExecForwarder(Forwarder):
    kind = "exec"

    def __init__(self, template: str) -> None:
        check_template(template)
        self.template = template

    def argv(self, host: str, port: int) -> list[str]:
        return shlex.split(self.template.format(host=host, port=port))

    def describe(self, host: str, port: int) -> str:
        return f"exec {shlex.join(self.argv(host, port))}"

    async def open(self, host: str, port: int, downstream: Downstream) -> Upstream:
        argv = self.argv(host, port)
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.subprocess_exec(
                lambda: _ExecUpstream(downstream, argv),
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                preexec_fn=die_with_parent,
            )
        except OSError as error:
            raise ForwarderError(
                f"cannot run `{argv[0]}` for --exec: {error.strerror or error}"
            ) from None
        return protocol
