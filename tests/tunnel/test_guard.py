"""`--read-only` through the tunnel's real connections (its Pumps, its sockets) to tansu: a
refused request's answer comes back among the broker's, in order, on the same connection;
a refused Produce with acks=0 ends its connection, counted, and not as an error."""

from __future__ import annotations

import socket
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from kafkatunnel.demo import LocalCluster
from kafkatunnel.probe import encode_request
from kafkatunnel.protocol import (
    FrameDecoder,
    Policy,
    response_body_offset,
    response_correlation_id,
)
from kafkatunnel.waiting import wait_for
from tests.protocol.requests_built import built
from tests.tunnel.conftest import MakeTunnel


def _metadata(topic: str) -> Any:
    request_type: Any = load_request_schema(3, 12)
    named = built(3, 12).topics[0]
    return request_type(topics=(type(named)(topic_id=None, name=topic),),
                        allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False)  # fmt: skip


def _answers(sock: socket.socket, count: int) -> list[bytes]:
    decoder, frames = FrameDecoder(), list[bytes]()
    while len(frames) < count:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {len(frames)} answers"
        frames += decoder.feed(chunk)
    return frames


def test_a_refusal_comes_in_order_among_the_brokers_answers_counted_and_said_once(
    cluster: LocalCluster, make_tunnel: MakeTunnel, caplog: pytest.LogCaptureFixture
) -> None:
    assert cluster.tansu is not None
    tunnel = make_tunnel(bootstrap=cluster.tansu.address, policy=Policy.of(read_only=True))
    host, port = tunnel.bootstrap_servers.split(",")[0].rsplit(":", 1)
    topic = f"guard-{uuid.uuid4().hex[:6]}"
    delete: Any = load_request_schema(20, 6)
    deletion = delete(topics=(type(built(20, 6).topics[0])(name=topic, topic_id=None),),
                      timeout=built(20, 6).timeout)  # fmt: skip
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        asked = _metadata(topic)
        sock.sendall(encode_request(asked, 1) + encode_request(deletion, 2)
                     + encode_request(asked, 3) + encode_request(deletion, 4))  # fmt: skip
        answers = _answers(sock, 4)
    assert [response_correlation_id(a) for a in answers] == [1, 2, 3, 4]
    body = answers[1][response_body_offset(answers[1], 20, 6) :]
    answer: Any = load_response_schema(20, 6)
    refused, _ = entity_reader(answer)(body, 0)
    assert [(r.name, r.error_code) for r in refused.responses] == [
        (topic, ErrorCode.topic_authorization_failed)]  # fmt: skip
    counted = sum(e["api_refused"].get("DeleteTopics", 0) for e in tunnel.status()["endpoints"])
    assert counted == 2
    said = [r.getMessage() for r in caplog.records if "refused DeleteTopics" in r.getMessage()]
    assert len(said) == 1, said  # once per client id and API


def test_a_refused_produce_without_acks_ends_its_connection_and_is_no_error(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    assert cluster.tansu is not None
    tunnel = make_tunnel(bootstrap=cluster.tansu.address, policy=Policy.of(read_only=True))
    host, port = tunnel.bootstrap_servers.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(encode_request(_metadata("any"), 1) + encode_request(built(0, 9, acks=0), 2))
        assert len(_answers(sock, 1)) == 1  # the answer before it still comes
        assert sock.recv(65536) == b""  # then the end, as Kafka's broker ends it
    endpoints = tunnel.status()["endpoints"]
    wait_for(lambda: sum(e["connections"] for e in tunnel.status()["endpoints"]) == 0,
             timeout=10, what="the connection to close")  # fmt: skip
    assert sum(e["api_refused"].get("Produce", 0) for e in endpoints) == 1
    assert sum(e["errors"] for e in tunnel.status()["endpoints"]) == 0
