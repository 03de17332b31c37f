"""A Kubernetes API server for the real kubectl, over the same world as the kubectl stand-in
(tests/kube/bin/kubectl): discovery, the reads kafkatunnel makes, SelfSubjectAccessReview,
and pods/portforward upgraded to SPDY/3.1 with the kubelet's side of the streams.

A stand-in kept for what a real cluster cannot produce on demand: zombie forwards (a pod
restarted or gone under a running kubectl, kubectl#686, kubernetes#67059, #78446), a laptop
that slept, API latency, and the behaviours of old kubectl releases against them. What a
real cluster does produce (RBAC by the real authorizer, idle streams closed by the runtime,
the kubelet or containerd restarted) is tested against one:
tests/worlds/kubernetes.py, tests/kube/real.

    python tests/kube/apiserver.py WORLD PORT [CERT KEY]    prints "serving on 127.0.0.1:PORT"

It answers as kube-apiserver and the kubelet do (Status objects with their reasons, the
kubelet's `error forwarding port P to pod ...` messages, SYN_REPLY per stream as
k8s.io/apimachinery's spdy connection sends it), so kubectl's own code decides what it prints
and how it exits. A data stream reaches 127.0.0.1:PORT (or the pod's `address`, else the
world's `pod_address`) inside the world's network namespace, as the kubelet reaches a pod's
port. Secrets are served from each namespace's `secrets` (name -> data, base64 as the API
holds it).

Faults, through the same files as the stand-in's, acted on where a cluster would act:
  <world>.lost-<pod>    the API server drops every port-forward connection to that pod (a
                        kubelet or API server restart): kubectl sees its connection close
  <world>.zombie-<pod>  "timeout": the pod's streams stop and new streams get no SYN_REPLY
                        (kubectl#686); "gone": each new stream pair gets the kubelet's
                        "No such container" error (kubernetes#67059); "forwarding-timeout":
                        the data stream gets no reply (kubernetes#78446)
  <world>.stall         a laptop that slept: every connection open before the file was
                        written stops answering, and <world>.stalled-<kubectl's pid> says so
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import json
import os
import socket
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

if __package__ in (None, ""):  # run as a script: make `tests.kube` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.kube import spdy

CLONE_NEWNET = 0x40000000
POD_UID = "0123456789abcdef"

Resource = tuple[str, str, bool, list[str], list[str]]  # name, kind, namespaced, verbs, short
CORE: list[Resource] = [
    ("pods", "Pod", True, ["get", "list"], ["po"]),
    ("pods/portforward", "PodPortForwardOptions", True, ["create", "get"], []),
    ("services", "Service", True, ["get", "list"], ["svc"]),
    ("secrets", "Secret", True, ["get", "list"], []),
    ("namespaces", "Namespace", False, ["get", "list"], ["ns"]),
]
GROUPS: dict[str, list[Resource]] = {
    "apps": [("statefulsets", "StatefulSet", True, ["get", "list"], ["sts"]),
             ("deployments", "Deployment", True, ["get", "list"], ["deploy"])],
    "authorization.k8s.io": [("selfsubjectaccessreviews", "SelfSubjectAccessReview", False,
                              ["create"], [])],
}  # fmt: skip


def resource_list(group_version: str, resources: list[Resource]) -> Any:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {"name": name, "singularName": "", "namespaced": namespaced, "kind": kind,
             "verbs": verbs, "shortNames": short}
            for name, kind, namespaced, verbs, short in resources
        ],
    }  # fmt: skip


def status(code: int, reason: str, message: str) -> tuple[int, Any]:
    return code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": message, "reason": reason, "code": code}  # fmt: skip


def matches(labels: dict[str, str], selector: str) -> bool:
    terms = (t.split("=", 1) for t in filter(None, selector.split(",")))
    return all(labels.get(key) == value for key, value in terms)


def pod_json(pod: dict[str, Any], namespace: str) -> Any:
    env = [{"name": k, "value": v} for k, v in pod.get("env", {}).items()]
    names = pod.get("port_names", {})  # port -> its name, as Strimzi names tcp-clientstls
    ready = "True" if pod.get("ready", True) else "False"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod["name"], "namespace": namespace,
                     "uid": pod.get("uid", POD_UID),
                     "labels": pod.get("labels", {})},
        "spec": {"containers": [{"name": "kafka", "env": env, "ports": [
            {"containerPort": p, **({"name": n} if (n := names.get(str(p))) else {})}
            for p in pod["ports"]]}],
            "volumes": [{"name": f"v{i}", "secret": {"secretName": secret}}
                        for i, secret in enumerate(pod.get("secrets", []))]},
        "status": {"phase": pod.get("phase", "Running"), "podIP": pod.get("ip"),
                   "conditions": [{"type": "Ready", "status": ready}]},
    }  # fmt: skip


def service_json(name: str, service: dict[str, Any], namespace: str) -> Any:
    """A Service: its selector, its labels and its ports (9092 when the world names none)."""
    ports = service.get("ports", [{"port": 9092, "targetPort": 9092}])
    return {"kind": "Service", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": service.get("labels", {})},
            "spec": {"selector": service["selector"], "type": "ClusterIP",
                     "ports": [{"protocol": "TCP", **port} for port in ports]}}  # fmt: skip


class Api:
    """The REST side: a world's namespaces as kube-apiserver would answer for them."""

    def __init__(self, world_path: str, port: int) -> None:
        self.world_path = world_path
        self.port = port

    def world(self) -> Any:
        return json.loads(Path(self.world_path).read_text())

    def version(self) -> str:
        """The world's resourceVersion: it changes whenever a test rewrites the file."""
        return str(os.stat(self.world_path).st_mtime_ns)

    def forbidden(
        self, world: Any, verb: str, resource: str, namespace: str | None, rule: str = ""
    ) -> tuple[int, Any] | None:
        """403 when the world denies `rule` ("VERB RESOURCE" by default): see denied()."""
        if not denied(world, rule or f"{verb} {resource}"):
            return None
        user = world.get("user", "developer")
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        return status(403, "Forbidden", f'{resource} is forbidden: User "{user}" cannot {verb} '
                      f'resource "{resource}" in API group "" {where}')  # fmt: skip

    def get(self, world: Any, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if path == "/version":
            minor = str(world.get("server_minor", 32))
            return 200, {"major": "1", "minor": minor, "gitVersion": f"v1.{minor}.0",
                         "platform": "linux/amd64"}  # fmt: skip
        if path == "/api":
            here = {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}
            return 200, {"kind": "APIVersions", "versions": ["v1"],
                         "serverAddressByClientCIDRs": [here]}  # fmt: skip
        if path == "/apis":
            groups = [{"name": g, "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                       "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"}}
                      for g in GROUPS]  # fmt: skip
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        if path == "/api/v1":
            return 200, resource_list("v1", CORE)
        if len(parts) == 3 and parts[0] == "apis" and parts[1] in GROUPS and parts[2] == "v1":
            return 200, resource_list(f"{parts[1]}/v1", GROUPS[parts[1]])
        spaces = world["namespaces"]
        selector = query.get("labelSelector", [""])[0]
        if parts[:3] == ["api", "v1", "pods"]:  # every namespace
            refused = self.forbidden(world, "list", "pods", None, "list pods --all-namespaces")
            if refused:
                return refused
            items = [pod_json(p, ns) for ns, space in spaces.items() for p in space["pods"]
                     if matches(p.get("labels", {}), selector)]  # fmt: skip
            return 200, {"kind": "PodList", "apiVersion": "v1", "items": items,
                         "metadata": {"resourceVersion": self.version()}}  # fmt: skip
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 4:
            refused = self.forbidden(world, "get", "namespaces", None)
            if refused:
                return refused
            if parts[3] not in spaces:
                return status(404, "NotFound", f'namespaces "{parts[3]}" not found')
            return 200, {"kind": "Namespace", "apiVersion": "v1",
                         "metadata": {"name": parts[3]}, "status": {"phase": "Active"}}  # fmt: skip
        prefix = parts[:4]
        if len(parts) < 5 or (prefix[2] != "namespaces" and prefix[:2] != ["apis", "apps"]):
            return status(404, "NotFound", "the server could not find the requested resource")
        namespace = parts[3] if parts[0] == "api" else parts[4]
        rest = parts[4:] if parts[0] == "api" else parts[5:]
        space = spaces.get(namespace, {"pods": []})
        kind = rest[0]
        if kind == "pods" and len(rest) == 1:
            refused = self.forbidden(world, "list", "pods", namespace)
            if refused:
                return refused
            items = [pod_json(p, namespace) for p in space["pods"]
                     if matches(p.get("labels", {}), selector)]  # fmt: skip
            return 200, {"kind": "PodList", "apiVersion": "v1", "items": items,
                         "metadata": {"resourceVersion": self.version()}}  # fmt: skip
        if kind == "pods":
            refused = self.forbidden(world, "get", "pods", namespace)
            if refused:
                return refused
            pod = next((p for p in space["pods"] if p["name"] == rest[1]), None)
            if pod is None:
                return status(404, "NotFound", f'pods "{rest[1]}" not found')
            return 200, pod_json(pod, namespace)
        if kind == "secrets" and len(rest) == 2:
            refused = self.forbidden(world, "get", "secrets", namespace)
            if refused:
                return refused
            data = space.get("secrets", {}).get(rest[1])
            if data is None:
                return status(404, "NotFound", f'secrets "{rest[1]}" not found')
            return 200, {"kind": "Secret", "apiVersion": "v1", "type": "Opaque",
                         "metadata": {"name": rest[1], "namespace": namespace},
                         "data": data}  # fmt: skip
        if kind == "services" and len(rest) == 1:
            refused = self.forbidden(world, "list", "services", namespace)
            if refused:
                return refused
            items = [service_json(name, found, namespace)
                     for name, found in space.get("services", {}).items()]  # fmt: skip
            return 200, {"kind": "ServiceList", "apiVersion": "v1", "metadata": {},
                         "items": items}  # fmt: skip
        full = {"statefulsets": "statefulsets.apps", "deployments": "deployments.apps"}
        refused = self.forbidden(world, "get", kind, namespace)
        if refused:
            return refused
        found = space.get(kind, {}).get(rest[1]) if len(rest) == 2 else None
        if found is None:
            name = rest[1] if len(rest) > 1 else ""
            return status(404, "NotFound", f'{full.get(kind, kind)} "{name}" not found')
        if kind == "services":
            return 200, service_json(rest[1], found, namespace)
        selector_json = found["selector"]
        spec = (
            {"selector": selector_json}
            if kind == "services"
            else {"selector": {"matchLabels": selector_json}}
        )
        api_version = "v1" if kind == "services" else "apps/v1"
        kind_name = {"services": "Service", "statefulsets": "StatefulSet"}.get(kind, "Deployment")
        metadata = {"name": rest[1], "namespace": namespace}
        return 200, {"kind": kind_name, "apiVersion": api_version, "metadata": metadata,
                     "spec": spec}  # fmt: skip

    def review(self, world: Any, body: Any) -> tuple[int, Any]:
        """SelfSubjectAccessReview: `kubectl auth can-i VERB RESOURCE`."""
        attributes = body["spec"]["resourceAttributes"]
        resource = attributes.get("resource", "")
        if attributes.get("subresource"):
            resource += "/" + attributes["subresource"]
        refused = denied(world, f"{attributes.get('verb')} {resource}")
        return 201, {**body, "status": {"allowed": not refused}}


def denied(world: Any, rule: str) -> bool:
    """RBAC as the world says: a rule ("VERB RESOURCE") in "forbidden" is denied, and where
    the world has an "allowed" list (a Role's rules), every rule not in it."""
    return rule in world.get("forbidden", []) or (
        "allowed" in world and rule not in world["allowed"]
    )


def _fields(message: bytes) -> dict[int, bytes]:
    """A protobuf message's length-delimited fields by number (the last of each wins)."""
    fields, at = {}, 0
    while at < len(message):
        key, at = _varint(message, at)
        if key & 7 == 2:
            size, at = _varint(message, at)
            fields[key >> 3] = message[at : at + size]
            at += size
        elif key & 7 == 0:
            _, at = _varint(message, at)
        else:
            raise ValueError(f"protobuf wire type {key & 7} is not used here")
    return fields


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def review_from_protobuf(body: bytes) -> Any:
    """kubectl 1.32+ posts SelfSubjectAccessReview as protobuf: the `k8s\\0` envelope
    (runtime.Unknown, raw = field 2), the review's spec (2), its resourceAttributes (1):
    namespace 1, verb 2, group 3, version 4, resource 5, subresource 6, name 7."""
    assert body.startswith(b"k8s\x00"), body[:8]
    review = _fields(_fields(body[4:])[2])
    attributes = _fields(_fields(review[2])[1])
    names = ("namespace", "verb", "group", "version", "resource", "subresource", "name")
    resource = {name: attributes.get(i + 1, b"").decode() for i, name in enumerate(names)}
    return {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
            "metadata": {}, "spec": {"resourceAttributes": resource}}  # fmt: skip


async def respond(writer: asyncio.StreamWriter, code: int, answer: Any) -> None:
    payload = json.dumps(answer).encode()
    head = (f"HTTP/1.1 {code} {'OK' if code < 300 else 'Error'}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(payload)}\r\n\r\n")  # fmt: skip
    writer.write(head.encode() + payload)
    await writer.drain()


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    """A request's body, by its length or in chunks (Go's client sends JSON bodies chunked)."""
    if headers.get("transfer-encoding", "").lower() != "chunked":
        length = int(headers.get("content-length", "0"))
        return await reader.readexactly(length) if length else b""
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    await reader.readuntil(b"\r\n")  # after the last chunk: no trailers
    return body


def enter_netns(name: str) -> None:
    """Move the calling thread into a named network namespace (os.setns needs Python 3.12)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name}")
    finally:
        os.close(fd)


@dataclass
class Pair:
    """The two streams of one forwarded connection, as the kubelet pairs them."""

    error: int | None = None
    data: int | None = None
    upstream: asyncio.StreamWriter | None = None
    early: bytearray = field(default_factory=bytearray)  # sent before the pod's port answered
    ended: bool = False  # kubectl sent FIN on the data stream
    task: asyncio.Task[None] | None = None


@dataclass
class Session:
    """One upgraded port-forward connection to one pod."""

    pod: str
    namespace: str
    port: int
    writer: asyncio.StreamWriter
    frames: spdy.Connection = field(default_factory=spdy.Connection)
    pairs: dict[str, Pair] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    mode: str | None = None  # a zombie kind or "stall" once a fault has taken it


class Server:
    def __init__(self, world_path: str, port: int) -> None:
        self.api = Api(world_path, port)
        self.world_path = world_path
        self.sessions: list[Session] = []
        netns = self.api.world()["netns"]
        self.pod_network = concurrent.futures.ThreadPoolExecutor(
            1, initializer=enter_netns, initargs=(netns,)
        )

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *lines = head.decode("latin-1").split("\r\n")
                method, target, _ = line.split(" ", 2)
                headers = {}
                for header in filter(None, lines):
                    name, _, value = header.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await read_body(reader, headers)
                url = urlsplit(target)
                world = self.api.world()  # read anew for each request: tests change it
                if world.get("unauthorized"):  # credentials expired or revoked
                    await respond(writer, *status(401, "Unauthorized", "Unauthorized"))
                    continue
                if url.path.endswith("/portforward"):
                    await self.port_forward(world, url.path, headers, reader, writer)
                    return
                query = parse_qs(url.query)
                if method == "GET" and query.get("watch") == ["true"]:
                    await self.watch(world, url.path, query, reader, writer)
                    return
                if method == "GET":
                    code, answer = self.api.get(world, url.path, query)
                elif method == "POST" and url.path.endswith("/selfsubjectaccessreviews"):
                    protobuf = headers.get("content-type", "").endswith("protobuf")
                    code, answer = self.api.review(
                        world, review_from_protobuf(body) if protobuf else json.loads(body)
                    )
                else:
                    code, answer = status(405, "MethodNotAllowed", f"{method} {url.path}")
                await respond(writer, code, answer)
        writer.close()

    async def watch(
        self,
        world: Any,
        path: str,
        query: dict[str, list[str]],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """`?watch=true` on a namespace's pods: from the world as it is now, each change of
        its pods as a watch event (ADDED, MODIFIED, DELETED), one JSON object per chunk as
        kube-apiserver streams them, until the client goes."""
        parts = path.strip("/").split("/")  # api v1 namespaces NS pods
        if len(parts) != 5 or parts[4] != "pods":
            await respond(writer, *status(405, "MethodNotAllowed", f"watch {path}"))
            return
        namespace, selector = parts[3], query.get("labelSelector", [""])[0]
        refused = self.api.forbidden(world, "watch", "pods", namespace)
        if refused:
            await respond(writer, *refused)
            return

        def pods() -> dict[str, Any]:
            space = self.api.world()["namespaces"].get(namespace, {"pods": []})
            return {p["name"]: pod_json(p, namespace) for p in space["pods"]
                    if matches(p.get("labels", {}), selector)}  # fmt: skip

        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        # from the listing kubectl made first: what changed since is sent at once
        since = query.get("resourceVersion", [""])[0]
        shown = pods() if since == self.api.version() else {}
        with contextlib.suppress(ConnectionError):
            while not reader.at_eof() and not writer.is_closing():
                await asyncio.sleep(0.1)
                with contextlib.suppress(OSError, ValueError):  # the file being rewritten
                    now = pods()
                    events = [("DELETED", shown[n]) for n in sorted(set(shown) - set(now))] + [
                        ("MODIFIED" if n in shown else "ADDED", pod)
                        for n, pod in sorted(now.items()) if shown.get(n) != pod]  # fmt: skip
                    for kind, pod in events:
                        data = json.dumps({"type": kind, "object": pod}).encode() + b"\n"
                        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                    shown = now
                await writer.drain()
        writer.close()

    async def port_forward(
        self,
        world: Any,
        path: str,
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        parts = path.strip("/").split("/")  # api v1 namespaces NS pods NAME portforward
        namespace, pod = parts[3], parts[5]
        refused = self.api.forbidden(world, "create", "pods/portforward", namespace)
        if headers.get("upgrade", "").lower() == "websocket":  # SPDY over WebSocket: not here
            refused = refused or status(400, "BadRequest", "websocket upgrade not supported")
        if refused is None and headers.get("upgrade", "").lower() != "spdy/3.1":
            refused = status(400, "BadRequest", "port-forward needs an upgrade to SPDY/3.1")
        if refused is not None:
            await respond(writer, *refused)
            writer.close()
            return
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
            b"X-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n"
        )
        session = Session(pod, namespace, 0, writer)
        self.sessions.append(session)
        try:
            while data := await reader.read(65536):
                for frame in session.frames.feed(data):
                    self.on_frame(session, frame)
        except (ConnectionError, spdy.SpdyError):
            pass
        finally:
            self.sessions.remove(session)
            for pair in session.pairs.values():
                if pair.task is not None:
                    pair.task.cancel()
            writer.close()

    def on_frame(self, session: Session, frame: spdy.Frame) -> None:
        if session.mode in ("timeout", "stall"):
            return  # the kubelet behind it is gone: nothing answers, not even pings
        if frame.kind == spdy.PING:
            session.writer.write(session.frames.ping(frame.value))
        elif frame.kind == spdy.SYN_STREAM:
            self.on_stream(session, frame)
        elif frame.kind == 0:
            pair = next((p for p in session.pairs.values() if p.data == frame.stream), None)
            if pair is None:
                return
            pair.ended |= frame.fin
            if pair.upstream is None:
                pair.early += frame.data
            else:
                pair.upstream.write(frame.data)
                if frame.fin and pair.upstream.can_write_eof():
                    pair.upstream.write_eof()
        elif frame.kind == spdy.RST_STREAM:
            for pair in session.pairs.values():
                if frame.stream == pair.data and pair.upstream is not None:
                    pair.upstream.close()

    def on_stream(self, session: Session, frame: spdy.Frame) -> None:
        headers = frame.headers or {}
        request, kind = headers.get("requestid", "?"), headers.get("streamtype")
        pair = session.pairs.setdefault(request, Pair())
        session.port = int(headers.get("port", "0"))
        if session.mode == "forwarding-timeout" and kind == "data":
            return
        session.writer.write(session.frames.reply(frame.stream))
        if kind == "error":
            pair.error = frame.stream
        else:
            pair.data = frame.stream
        if pair.error is not None and pair.data is not None:
            pair.task = asyncio.get_running_loop().create_task(self.forward(session, pair))

    async def forward(self, session: Session, pair: Pair) -> None:
        """The kubelet's portForward: the pod's port to the data stream; a failure is
        written on the error stream, and both streams are closed when it is over."""
        assert pair.error is not None and pair.data is not None
        frames, out = session.frames, session.writer
        message = b""
        if session.mode == "gone":
            message = (f"error forwarding port {session.port} to pod {POD_UID}, uid : Error: "
                       f"No such container: {POD_UID}").encode()  # fmt: skip
        else:
            try:
                reader, pair.upstream = await self.connect(session)
            except OSError as error:
                message = (f"error forwarding port {session.port} to pod {POD_UID}, uid : "
                           f"failed to execute portforward in network namespace "
                           f'"/var/run/netns/cni-0000": failed to connect to localhost:'
                           f"{session.port} inside namespace {POD_UID}, IPv4: dial tcp4 "
                           f"127.0.0.1:{session.port}: {error.strerror}").encode()  # fmt: skip
            else:
                pair.upstream.write(bytes(pair.early))
                if pair.ended:
                    pair.upstream.write_eof()
                with contextlib.suppress(ConnectionError):
                    while chunk := await reader.read(65536):
                        out.write(frames.data(pair.data, chunk))
                        await out.drain()
                pair.upstream.close()
        for request in [r for r, p in session.pairs.items() if p is pair]:
            del session.pairs[request]  # its streams end here
        if out.is_closing():
            return
        out.write(frames.data(pair.data, b"", fin=True))
        out.write(frames.data(pair.error, message, fin=True))

    async def connect(self, session: Session) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The pod's port, where the pod's own `address` or the world's says it is."""
        world = self.api.world()
        pods = world["namespaces"].get(session.namespace, {}).get("pods", [])
        found: dict[str, Any] = next((p for p in pods if p["name"] == session.pod), {})
        address = found.get("address", world.get("pod_address", "127.0.0.1"))
        port = session.port

        def dial() -> socket.socket:
            sock = socket.create_connection((address, port), timeout=5)
            sock.setblocking(False)
            return sock

        loop = asyncio.get_running_loop()
        sock = await loop.run_in_executor(self.pod_network, dial)
        return await asyncio.open_connection(sock=sock)

    async def watch_faults(self) -> None:
        """The fault files, checked every 50 ms as the stand-in checks them."""
        while True:
            await asyncio.sleep(0.05)
            for session in list(self.sessions):
                lost = Path(f"{self.world_path}.lost-{session.pod}")
                if lost.exists():
                    with contextlib.suppress(FileNotFoundError):
                        lost.unlink()
                    for other in [s for s in self.sessions if s.pod == session.pod]:
                        other.writer.transport.abort()
                    continue
                claim = Path(f"{self.world_path}.zombie-{session.pod}")
                if session.mode is None and claim.exists():
                    mode = claim.read_text().strip()
                    with contextlib.suppress(FileNotFoundError):
                        claim.unlink()
                    for other in [s for s in self.sessions if s.pod == session.pod]:
                        other.mode = mode
                        if mode in ("timeout", "gone"):  # the pod behind its streams is gone
                            for pair in other.pairs.values():
                                if pair.upstream is not None:
                                    pair.upstream.transport.abort()
                stall = Path(f"{self.world_path}.stall")
                with contextlib.suppress(FileNotFoundError):
                    if session.mode is None and stall.stat().st_mtime >= session.started:
                        session.mode = "stall"
                        for pair in session.pairs.values():
                            if pair.task is not None:
                                pair.task.cancel()
                        for pid in peer_pids(session.writer):  # kubectl's, as the stand-in
                            Path(f"{self.world_path}.stalled-{pid}").touch()


def peer_pids(writer: asyncio.StreamWriter) -> list[int]:
    """The processes on this machine holding the other end of a loopback connection (the
    kubectl of a session): its socket's inode from /proc/net/tcp, then whose fd it is."""
    port = writer.get_extra_info("peername")[1]
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}"):
            inodes.add(f"socket:[{fields[9]}]")
    pids = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                pids.append(int(fd_dir.parent.name))
    return pids


async def serve(world_path: str, port: int, cert: str | None, key: str | None) -> None:
    server = Server(world_path, port)
    tls = None
    if cert and key:  # as clusters serve it: HTTPS (kubectl runs exec plugins only then)
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(cert, key)
        tls.set_alpn_protocols(["http/1.1"])
    listener = await asyncio.start_server(server.handle, "127.0.0.1", port, ssl=tls)
    print(f"serving on 127.0.0.1:{port}", flush=True)
    async with listener:
        await asyncio.gather(listener.serve_forever(), server.watch_faults())


if __name__ == "__main__":
    world_arg, port_arg, *tls_args = sys.argv[1:]
    cert_arg, key_arg = tls_args if tls_args else (None, None)
    asyncio.run(serve(world_arg, int(port_arg), cert_arg, key_arg))
