"""A pod's HTTP server in the API server stand-in's world: Python's http.server answering the
REST paths clients call on a Confluent Schema Registry (subjects, register, schema by id)
and on Kafka Connect (its root, /connectors), each answer naming the pod that gave it.

The answers copy the shapes the Confluent Schema Registry API reference (v7, the API
SchemaRegistryClient of confluent-kafka 2.16 calls) and Apache Kafka Connect's REST API
(3.9) document: `{"id": N}` for a registration, `{"schema": ...}` by id, the
`error_code`/`message` body of a 404. The real programs run in tests/apache/test_companions.py
(Kafka Connect and Apicurio Registry 2.4.2.Final beside Apache Kafka). This server
stays for the forward's faults only, where each test says why: an answer that names the
pod which gave it is what tells an old pod's last answer from a new pod's first.

    python tests/kube/http_service.py KIND PORT POD    prints "serving on PORT"
"""

from __future__ import annotations

import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SCHEMAS: dict[int, str] = {}
SUBJECTS: dict[str, list[int]] = {}
LOCK = threading.Lock()


def registry(method: str, path: str, body: Any) -> tuple[int, Any]:
    """The Schema Registry REST API's answers for the calls SchemaRegistryClient makes."""
    if method == "GET" and path == "/subjects":
        return 200, sorted(SUBJECTS)
    if method == "GET" and path == "/config":
        return 200, {"compatibilityLevel": "BACKWARD"}
    registered = re.fullmatch(r"/subjects/([^/]+)/versions", path)
    if method == "POST" and registered:
        with LOCK:
            schema = body["schema"]
            found = next((i for i, s in SCHEMAS.items() if s == schema), None)
            if found is None:
                found = len(SCHEMAS) + 1
                SCHEMAS[found] = schema
            SUBJECTS.setdefault(registered[1], []).append(found)
        return 200, {"id": found}
    by_id = re.fullmatch(r"/schemas/ids/(\d+)", path)
    if method == "GET" and by_id and int(by_id[1]) in SCHEMAS:
        return 200, {"schema": SCHEMAS[int(by_id[1])], "schemaType": "AVRO"}
    return 404, {"error_code": 40401, "message": "Subject or schema not found"}


def connect(method: str, path: str, body: Any) -> tuple[int, Any]:
    """Kafka Connect's REST API: its version and the (empty) list of connectors."""
    if method == "GET" and path == "/":
        return 200, {"version": "3.9.0", "commit": "test", "kafka_cluster_id": "mock"}
    if method == "GET" and path == "/connectors":
        return 200, []
    return 404, {"error_code": 404, "message": f"HTTP 404 Not Found: {path}"}


KINDS = {"schema-registry": registry, "connect": connect}


def handler(kind: str, pod: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def answer(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            code, answer = KINDS[kind](method, self.path.split("?", 1)[0], body)
            payload = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("X-Pod", pod)
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(payload)

        def do_GET(self) -> None:
            self.answer("GET")

        def do_POST(self) -> None:
            self.answer("POST")

        def do_HEAD(self) -> None:
            self.answer("HEAD")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


if __name__ == "__main__":
    kind_arg, port_arg, pod_arg = sys.argv[1:]
    server = ThreadingHTTPServer(("127.0.0.1", int(port_arg)), handler(kind_arg, pod_arg))
    server.daemon_threads = True
    print(f"serving on {port_arg}", flush=True)
    server.serve_forever()
