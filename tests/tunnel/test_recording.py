"""`up --record` on the isolated cluster: the tunnel acceptance session verifies ok, the
single-forward control (captured with dumpcap) fails naming its groups, replayed look-ups
through a live tunnel answer, and a SASL/PLAIN password never reaches a recording."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from typing import Any

from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as SaslHandshakeV0
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from kafkatunnel.demo import LocalCluster
from kafkatunnel.demo.single_forward import SingleForward
from kafkatunnel.hostnames import split_address
from kafkatunnel.verify.calls import FileDecoder
from kafkatunnel.verify.job import verify_local, verify_spark
from kafkatunnel.verify.judge import MISROUTED, OK
from kafkatunnel.verify.replay import replay
from tests.kio_messages import request_frame
from tests.tunnel.conftest import MakeTunnel
from tests.worlds.sessions import (
    capture_single_forward,
    record_routed_session,
    spread_workload,
)


def test_the_acceptance_session_verifies_ok_and_the_control_fails(
    cluster: LocalCluster, tmp_path: Path, spark: Any
) -> None:
    work = spread_workload(cluster, f"rec-{uuid.uuid4().hex[:6]}")
    cluster.produce_inside(work.topic, work.messages, partition=0)
    control = capture_single_forward(cluster, work, tmp_path / "control.pcapng")
    stuck = {g for g, r in control.items() if r.not_coordinator}
    assert len(stuck) == 4  # the groups of the two brokers not forwarded to
    consumed = {group: result.consumed for group, result in control.items()}
    results = record_routed_session(
        cluster, work, tmp_path / "routed", already=work.messages, committed=consumed
    )
    assert all(r.ok for r in results.values()), {g: r.consumed for g, r in results.items()}

    routed = verify_spark([str(tmp_path / "routed")], spark)
    assert routed.ok and routed.leaks == [] and routed.problems == []
    groups = {v.key: v for v in routed.verdicts if v.key_type == 0}
    assert set(groups) == set(work.groups)
    assert all(v.verdict == OK and v.coordinator == work.groups[k] for k, v in groups.items())
    transactions = {v.key: v for v in routed.verdicts if v.key in work.transactional_ids}
    assert all(v.verdict == OK for v in transactions.values()) and len(transactions) == 3

    failed = verify_local([str(tmp_path / "control.pcapng")])
    assert not failed.ok
    misrouted = {v.key: v for v in failed.verdicts if v.verdict == MISROUTED}
    assert set(misrouted) == stuck
    assert all(v.errors["NOT_COORDINATOR"] >= 1 for v in misrouted.values())


def test_replayed_look_ups_answer_through_the_tunnel_and_not_through_one_forward(
    cluster: LocalCluster, make_tunnel: MakeTunnel, spark: Any
) -> None:
    work = spread_workload(cluster, f"replay-{uuid.uuid4().hex[:6]}")
    tunnel = make_tunnel()
    keys = [(g, 0) for g in work.groups]
    results = replay(keys, tunnel.bootstrap_servers, spark)  # as Spark tasks
    assert all(r["ok"] and r["checked_with"] == "OffsetFetch, Heartbeat" for r in results), results
    assert {r["coordinator"] for r in results} == {1, 2, 3}
    leader = cluster.mock[0]
    with SingleForward(cluster, leader):
        direct = replay(keys, leader.address, None)
    failing = {r["key"] for r in direct if not r["ok"]}
    assert failing == {g for g, node in work.groups.items() if node != leader.node_id}
    assert all(r["error"] == "NOT_COORDINATOR" for r in direct if not r["ok"])


def test_replayed_look_ups_against_tansu(cluster: LocalCluster, make_tunnel: MakeTunnel) -> None:
    """tansu, the broker with a Kubernetes name the project ships with: its OffsetFetch
    answers for all topics do not decode ("Buffer is exhausted"); the replay's, for no
    partition, do, so the group is checked with both requests."""
    assert cluster.tansu is not None
    tunnel = make_tunnel(bootstrap=cluster.tansu.address)
    (result,) = replay([(f"replay-tansu-{uuid.uuid4().hex[:6]}", 0)], tunnel.bootstrap_servers,
                       None)  # fmt: skip
    assert result["ok"] and result["coordinator"] == 111, result
    assert result["checked_with"] == "OffsetFetch, Heartbeat"


PASSWORD = b"s3cr3t-Pa55w0rd"


def _send(address: str, *frames: bytes) -> None:
    host, port = split_address(address)
    with socket.create_connection((host, port), timeout=5) as sock:
        for data in frames:
            sock.sendall(data)
        sock.settimeout(2)
        try:
            while sock.recv(65536):
                pass
        except TimeoutError:
            pass


def test_a_sasl_plain_password_never_reaches_a_recording(
    cluster: LocalCluster, make_tunnel: MakeTunnel, tmp_path: Path
) -> None:
    """The client side of SASL/PLAIN as Kafka clients send it (SaslHandshake v1, then the
    token `\\0user\\0password` in SaslAuthenticate), and the legacy form (a raw token after
    SaslHandshake v0), through a recording tunnel to a real broker."""
    tunnel = make_tunnel(record_dir=tmp_path)
    token = b"\x00alice\x00" + PASSWORD
    _send(
        tunnel.bootstrap_servers,
        request_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1),
        request_frame(SaslAuthenticateRequest(auth_bytes=token), 2),
    )
    _send(
        tunnel.bootstrap_servers,
        request_frame(SaslHandshakeV0(mechanism="PLAIN"), 1),
        len(token).to_bytes(4, "big") + token,
    )
    tunnel.stop()
    files = sorted(tmp_path.iterdir())
    data = b"".join(path.read_bytes() for path in files)
    assert PASSWORD not in data and b"alice" not in data
    seen = [
        entry
        for path in files
        for entry in FileDecoder(str(path), path.read_bytes(), log_frames=True).run().frame_log
        or []
    ]
    assert (36, 2, True) in seen  # the SaslAuthenticate request is there, emptied


def test_every_broker_clients_are_told_of_is_in_the_recording_connected_to_or_not(
    make_tunnel: MakeTunnel, tmp_path: Path
) -> None:
    """A client that asks the bootstrap broker for Metadata and connects to no broker (as
    librdkafka, connecting only to the brokers it needs, never connects to some): every
    address the answer named is a listener the recording describes, so verify finds no
    leak. (Listeners were described on their first connection: the brokers never
    connected to were reported as leaks.)"""
    tunnel = make_tunnel(record_dir=tmp_path)
    _send(
        tunnel.bootstrap_servers,
        request_frame(
            MetadataRequest(
                topics=None,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            1,
        ),
    )
    tunnel.stop()
    report = verify_local([str(tmp_path)])
    assert report.leaks == [] and report.tunnel_recording, report.leaks
    (path,) = tmp_path.iterdir()
    summary = FileDecoder(str(path), path.read_bytes()).run().summary
    described = {str(listener["node_id"]): listener["tunnel"] for listener in summary.listeners}
    assert len(set(described.values())) == 4, described  # the bootstrap and 3 brokers


def test_verify_replays_the_recorded_groups_against_a_live_tunnel(
    make_tunnel: MakeTunnel,
) -> None:
    import subprocess
    import sys

    from tests.verify.conftest import ROUTED

    tunnel = make_tunnel()
    out = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--in-process", str(ROUTED),
         "--replay-against", tunnel.bootstrap_servers],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "replayed look-ups against" in out.stdout
    assert out.stdout.count("OffsetFetch, Heartbeat") == 6  # one per recorded group
