"""A cluster that lies about its brokers, for the trust tests.

A byte filter in an `--exec` forwarder: it runs the real connection command (socat into
the test cluster's namespace), passes every byte through, and adds brokers with hostile
names to the Metadata answers of the real brokers behind it, decoded and encoded again
with kio (Kafka's own schemas, independent of the code under test). So the brokers that
answer are real; only their list of peers is a lie.

    python -m tests.tunnel.hostile SOCKET -- ip netns exec NS socat STDIO TCP:{host}:{port}

SOCKET is the filter's server, `python -m tests.tunnel.hostile --serve SPEC.json SOCKET`;
SPEC: {"brokers": [[node_id, host, port], ...], "many": COUNT, "client_id": ID or null}:
`many` adds COUNT brokers named `kafka-N.many.example.com` (node ids from 1000); a
`client_id` tampers only the answers to that client (the tunnel's own probe is
"kafkatunnel"), so the test's clients need not meet thousands of brokers themselves.

Each connection is a process of its own (as --exec and kubectl's streams run them), but the
lying is done by one server per SPEC, started by the test (`filter_argv`, `hostile_exec`):
the per-connection command only hands its stdin, stdout and stderr to that server, which
forks a relay with kio already loaded. Loading kio takes ~0.3 s of CPU: paid on every
connection, a real cluster's brokers would have looked slow to answer (three consumer
groups open ~20 connections at once), more so the more loaded the machine.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

METADATA = 3
METADATA_VERSIONS = range(13)  # the schemas a server loads before it forks relays
MANY_FIRST_NODE = 1000
SERVER_START = 30.0  # seconds a filter server may take to listen (it loads kio first)


def read_exact(stream: IO[bytes], count: int) -> bytes | None:
    data = b""
    while len(data) < count:
        chunk = stream.read(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def frames(stream: IO[bytes]) -> Any:
    while (size := read_exact(stream, 4)) is not None:
        body = read_exact(stream, int.from_bytes(size, "big"))
        if body is None:
            return
        yield body


def request_head(body: bytes) -> tuple[int, int, int, str | None]:
    """api key, version, correlation id and client id of a request."""
    key = int.from_bytes(body[0:2], "big", signed=True)
    version = int.from_bytes(body[2:4], "big", signed=True)
    correlation = int.from_bytes(body[4:8], "big", signed=True)
    length = int.from_bytes(body[8:10], "big", signed=True)
    client = None if length < 0 else body[10 : 10 + length].decode(errors="replace")
    return key, version, correlation, client


def hostile_brokers(spec: dict[str, Any]) -> list[tuple[int, str, int]]:
    brokers = [(int(n), str(h), int(p)) for n, h, p in spec.get("brokers", [])]
    for i in range(int(spec.get("many", 0))):
        brokers.append((MANY_FIRST_NODE + i, f"kafka-{i}.many.example.com", 9092))
    return brokers


def tamper(body: bytes, version: int, brokers: list[tuple[int, str, int]]) -> bytes:
    """A Metadata response body (header included) with `brokers` added to its list."""
    from kio.index import load_response_schema
    from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
    from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
    from kio.serial import entity_reader, entity_writer

    schema = load_response_schema(METADATA, version)
    header_type: Any = ResponseHeaderV1 if schema.__flexible__ else ResponseHeaderV0
    header, offset = entity_reader(header_type)(body, 0)
    payload: Any
    payload, _ = entity_reader(schema)(body, offset)
    template = payload.brokers[0]
    added = tuple(
        dataclasses.replace(template, node_id=node, host=host, port=port)
        for node, host, port in brokers
    )
    payload = dataclasses.replace(payload, brokers=(*payload.brokers, *added))
    out = io.BytesIO()
    entity_writer(header_type)(out, header)
    entity_writer(schema)(out, payload)
    return out.getvalue()


def hostile_names(marker: str) -> list[list[object]]:
    """Brokers a lying cluster adds: each would have done harm somewhere before [trust]."""
    return [
        # options for ssh, and a command of its own for a shell
        [101, f"x:1 -oProxyCommand=touch${{IFS}}{marker} -oUser=;touch${{IFS}}{marker};", 9092],
        [102, "evil\n6.6.6.6 evil.example.org", 9092],  # a line of its own in /etc/hosts
        [103, "kafka-3/../../../../tmp/resolver-escape", 9092],  # out of /etc/resolver
        [104, "login.example.com", 9092],  # a good name, outside the cluster's zones
    ]


# Names a broker could advertise to make public names resolve on the user's machine: each is
# inside the blanket `svc` zone or the cluster domain, and a naive parser of Kubernetes
# names derives `github.com`, `kafka-3.github.com`, `www.google.com`, `xn--80ak6aa92e.com`
# (and the routing domain `com`) from them.
PUBLIC_LOOKALIKES = [
    "github.com.x.svc",
    "kafka-3.github.com.svc.cluster.local",
    "www.google.com.shop.svc.cluster.local",
    "xn--80ak6aa92e.com.shop.svc",
    "kafka-0.com.shop.svc",  # a headless service named like a TLD
]
# What must never resolve through the tunnel, whatever the namespaces
PUBLIC = {"github.com", "kafka-3.github.com", "www.google.com", "xn--80ak6aa92e.com", "com",
          "shop", "kafka-0.com", "kafka-0.com.shop", "google.com.shop", "com.shop"}  # fmt: skip


def public_lookalikes() -> list[list[object]]:
    """Brokers a lying cluster adds that derive public names (ids 201 on; tansu is 111)."""
    return [[201 + i, name, 9092] for i, name in enumerate(PUBLIC_LOOKALIKES)]


def hostile_exec(exec_template: str, spec: dict[str, Any], tmp: Path) -> str:
    """An --exec template whose stream passes through the lying filter."""
    spec_file = tmp / f"hostile-{uuid.uuid4().hex[:6]}.json"
    spec_file.write_text(json.dumps(spec))
    return f"{shlex.join(filter_argv(str(spec_file)))} {exec_template}"


_servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}  # spec file -> server, socket


def filter_argv(spec_file: str) -> list[str]:
    """The words that put this filter in front of a stream command (its server started, if
    not yet: it lives as long as this process, or until `stop_servers`)."""
    if spec_file not in _servers:
        _servers[spec_file] = _start_server(spec_file)
    return [sys.executable, "-m", "tests.tunnel.hostile", _servers[spec_file][1], "--"]


def _start_server(spec_file: str) -> tuple[subprocess.Popen[bytes], str]:
    from kafkatunnel.pids import die_with_parent

    path = os.path.join(tempfile.mkdtemp(prefix="kt-hostile-"), "filter")  # short: AF_UNIX
    root = str(Path(__file__).resolve().parents[2])
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.tunnel.hostile", "--serve", spec_file, path],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)}, preexec_fn=die_with_parent,
    )  # fmt: skip
    deadline = time.monotonic() + SERVER_START
    while not os.path.exists(path):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"the hostile filter's server for {spec_file} did not start")
        time.sleep(0.05)
    if len(_servers) == 0:
        atexit.register(stop_servers)
    return server, path


def stop_servers() -> None:
    for spec_file, (server, path) in list(_servers.items()):
        server.kill()
        server.wait()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        del _servers[spec_file]


def relay(
    source: IO[bytes], sink: IO[bytes], child: subprocess.Popen[bytes], spec: dict[str, Any]
) -> int:
    """Pass the stream of a command (`child`) between source and sink, lying in its
    Metadata answers as `spec` says; its exit status (0 if it was ended for the stream's
    end)."""
    brokers = hostile_brokers(spec)
    only = spec.get("client_id")
    assert child.stdin is not None and child.stdout is not None
    asked: dict[int, tuple[int, int, str | None]] = {}
    lock = threading.Lock()

    def requests() -> None:
        assert child.stdin is not None
        try:
            for body in frames(source):
                key, version, correlation, client = request_head(body)
                with lock:
                    asked[correlation] = (key, version, client)
                child.stdin.write(len(body).to_bytes(4, "big") + body)
                child.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        finally:
            with contextlib.suppress(OSError):
                child.stdin.close()

    threading.Thread(target=requests, daemon=True).start()
    try:
        for body in frames(child.stdout):
            correlation = int.from_bytes(body[0:4], "big", signed=True)
            with lock:
                key, version, client = asked.pop(correlation, (-1, -1, None))
            if key == METADATA and brokers and (only is None or client == only):
                body = tamper(body, version, brokers)
            sink.write(len(body).to_bytes(4, "big") + body)
            sink.flush()
    except (BrokenPipeError, OSError):
        pass
    if child.poll() is None:
        child.kill()
        child.wait()
        return 0
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


def serve(spec_file: str, path: str) -> None:
    """Accept connections' streams (their stdin, stdout, stderr and command) and relay
    each in a forked child: kio is loaded once, here."""
    from kio.index import load_response_schema
    from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
    from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
    from kio.serial import entity_reader, entity_writer

    for entity in (ResponseHeaderV0, ResponseHeaderV1):
        entity_reader(entity), entity_writer(entity)
    for version in METADATA_VERSIONS:
        with contextlib.suppress(Exception):  # versions this kio does not know
            schema = load_response_schema(METADATA, version)
            entity_reader(schema), entity_writer(schema)
    with open(spec_file) as file:
        spec = json.load(file)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the relays reap themselves
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # appears once it accepts
    while True:
        conn, _ = listener.accept()
        try:
            message, fds, _, _ = socket.recv_fds(conn, 65536, 3)
        except OSError:
            conn.close()
            continue
        if len(fds) != 3 or not message:
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _relay_child(conn, fds, json.loads(message), spec)
        for fd in fds:
            os.close(fd)
        conn.close()


def _relay_child(conn: socket.socket, fds: list[int], command: list[str], spec: Any) -> None:
    """In a forked child: relay, and end with the connection's process (killed, it ends
    the relay too); tell it the command's exit status."""
    code = 1
    try:
        source, sink = os.fdopen(fds[0], "rb", buffering=0), os.fdopen(fds[1], "wb")
        pipe = subprocess.PIPE
        child = subprocess.Popen(command, stdin=pipe, stdout=pipe, stderr=fds[2])

        def watch() -> None:
            with contextlib.suppress(OSError):
                conn.recv(1)  # b"": the connection's process is gone
            with contextlib.suppress(OSError):
                child.kill()
            os._exit(code)

        threading.Thread(target=watch, daemon=True).start()
        code = relay(source, sink, child, spec) & 0xFF
        with contextlib.suppress(OSError):
            conn.sendall(bytes([code]))
    finally:
        os._exit(code)


def connect(path: str, command: list[str]) -> int:
    """The per-connection command: hand stdin, stdout and stderr to the server; its
    command's exit status, once it is done."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.connect(path)
        socket.send_fds(server, [json.dumps(command).encode()], [0, 1, 2])
        status = server.recv(1)
    return status[0] if status else 1


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], sys.argv[3])
        return
    path, separator, *command = sys.argv[1:]
    assert separator == "--", "usage: hostile SOCKET -- COMMAND..."
    sys.exit(connect(path, command))


if __name__ == "__main__":
    main()
