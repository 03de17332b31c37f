"""A cluster that lies about its brokers, for the trust tests.

A byte filter in an `--exec` forwarder: it runs the real connection command (socat into
the test cluster's namespace), passes every byte through, and adds brokers with hostile
names to the Metadata answers of the real brokers behind it, decoded and encoded again
with kio (Kafka's own schemas, independent of the code under test). So the brokers that
answer are real; only their list of peers is a lie.

    python -m tests.tunnel.hostile SPEC.json -- ip netns exec NS socat STDIO TCP:{host}:{port}

SPEC: {"brokers": [[node_id, host, port], ...], "many": COUNT, "client_id": ID or null}:
`many` adds COUNT brokers named `kafka-N.many.example.com` (node ids from 1000); a
`client_id` tampers only the answers to that client (the tunnel's own probe is
"kafkatunnel"), so the test's clients need not meet thousands of brokers themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shlex
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import IO, Any

from kio.index import load_response_schema
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer

METADATA = 3
MANY_FIRST_NODE = 1000


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


def filter_argv(spec_file: str) -> list[str]:
    """The words that put this filter in front of a stream command."""
    return [sys.executable, "-m", "tests.tunnel.hostile", spec_file, "--"]


def main() -> None:
    spec_file, separator, *command = sys.argv[1:]
    assert separator == "--", "usage: hostile SPEC.json -- COMMAND..."
    with open(spec_file) as file:
        spec = json.load(file)
    brokers = hostile_brokers(spec)
    only = spec.get("client_id")
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    asked: dict[int, tuple[int, int, str | None]] = {}
    lock = threading.Lock()

    def requests() -> None:
        assert child.stdin is not None
        try:
            for body in frames(sys.stdin.buffer):
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
    out = sys.stdout.buffer
    try:
        for body in frames(child.stdout):
            correlation = int.from_bytes(body[0:4], "big", signed=True)
            with lock:
                key, version, client = asked.pop(correlation, (-1, -1, None))
            if key == METADATA and brokers and (only is None or client == only):
                body = tamper(body, version, brokers)
            out.write(len(body).to_bytes(4, "big") + body)
            out.flush()
    except (BrokenPipeError, OSError):
        pass
    finally:
        child.kill()
        child.wait()


if __name__ == "__main__":
    main()
