"""A client that stops reading stalls only itself: other clients carry on through the same
listener, and when it reads again every answer arrives, in order, none lost."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Callable

from kafkatunnel.demo import LocalCluster
from kafkatunnel.demo.workload import consume_group, produce
from kafkatunnel.hostnames import split_address
from kafkatunnel.protocol import FrameDecoder
from tests.tunnel.conftest import MakeTunnel

REQUESTS = 50_000  # ~20 MB of ApiVersions answers: more than every socket buffer between


def api_versions(correlation_id: int) -> bytes:
    body = (18).to_bytes(2, "big") + (0).to_bytes(2, "big") + correlation_id.to_bytes(4, "big")
    body += (5).to_bytes(2, "big") + b"stall"
    return len(body).to_bytes(4, "big") + body


def stalled_client_gets_every_answer(bootstrap: str, meanwhile: Callable[[], None]) -> None:
    """A client sends REQUESTS ApiVersions and reads nothing while `meanwhile` runs (other
    clients' work); then it reads, and every answer must come, in order."""
    stalled = socket.create_connection(split_address(bootstrap))
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    requests = b"".join(api_versions(i) for i in range(REQUESTS))
    sender = threading.Thread(target=stalled.sendall, args=(requests,), daemon=True)
    sender.start()  # blocks once the answers back up to the broker
    meanwhile()
    decoder = FrameDecoder(max_frame_size=1 << 20)
    answers: list[int] = []
    stalled.settimeout(30)
    while len(answers) < REQUESTS:
        data = stalled.recv(1 << 20)
        assert data, f"the tunnel closed the connection after {len(answers)} answers"
        answers.extend(int.from_bytes(f[4:8], "big") for f in decoder.feed(data))
    sender.join(30)
    stalled.close()
    assert answers == list(range(REQUESTS))


def test_a_client_that_stops_reading_stalls_only_itself(
    cluster: LocalCluster, make_tunnel: MakeTunnel
) -> None:
    tunnel = make_tunnel()
    topic = f"stall-{uuid.uuid4().hex[:6]}"

    def others_carry_on() -> None:
        assert produce(tunnel.bootstrap_servers, topic, 100) == 100
        result = consume_group(tunnel.bootstrap_servers, f"{topic}-g", topic, 100, timeout=60)
        assert result.consumed == 100

    stalled_client_gets_every_answer(tunnel.bootstrap_servers, others_carry_on)
    assert tunnel.status()["endpoints"][0]["errors"] == 0
