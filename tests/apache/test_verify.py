"""`kafkatunnel verify` on traffic with Apache Kafka: the tunnel's own recording, and a
plain tcpdump capture of the field report's workaround (one forward to kafka-0 and a hosts
entry for every broker name). Groups and transactional ids on all three coordinators."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kafkatunnel.demo.apache import OneForward
from kafkatunnel.demo.workload import consume_group, produce, produce_transaction
from tests.apache.test_apache_kafka import tunnel
from tests.worlds.apache import ApacheKafka

WORKLOAD = [sys.executable, "-m", "kafkatunnel.demo.workload"]
MESSAGES = 20


def verify(path: Path, *flags: str) -> tuple[int, dict[str, str], str]:
    """verify's exit code, its verdict for each group and transactional id, its stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "kafkatunnel", "verify", "--in-process", "--json", "-", *flags,
         str(path)], capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return result.returncode, {g["key"]: g["verdict"] for g in report["groups"]}, result.stderr


def one_partition_led_by_broker_0(kafka: ApacheKafka) -> str:
    """A topic whose one partition broker 0 leads: through the one forward, its records
    can be fetched; what differs between groups is only their coordinator."""
    topic = f"apache-verify-{uuid.uuid4().hex[:6]}"
    kafka.tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", kafka.bootstrap(),
               "--create", "--topic", topic, "--replica-assignment", "0:1:2")  # fmt: skip
    return topic


def test_verify_judges_a_recording_and_a_single_forwards_capture(
    apache_kafka: ApacheKafka, tmp_path: Path
) -> None:
    topic = one_partition_led_by_broker_0(apache_kafka)
    groups = {n: g for n, (g,) in apache_kafka.groups_by_coordinator(1, f"{topic}-g").items()}
    ids = {n: t for n, (t,) in apache_kafka.groups_by_coordinator(
        1, f"{topic}-t", transactional=True).items()}  # fmt: skip

    # Through the tunnel, recording: every group and transactional id reaches its coordinator.
    recording = tmp_path / "recording"
    with tunnel(apache_kafka, "plain", "--record", str(recording)) as bootstrap:
        assert produce(bootstrap, topic, MESSAGES) == MESSAGES
        for transactional_id in ids.values():
            produce_transaction(bootstrap, topic, transactional_id, 5, timeout=60)
        expected = MESSAGES + 5 * len(ids)
        for group in groups.values():
            assert consume_group(bootstrap, group, topic, expected, timeout=60).consumed == expected
    code, verdicts, said = verify(recording, "--strict")
    assert code == 0, said
    for key in [*groups.values(), *ids.values()]:
        assert verdicts.get(key) == "ok", (key, verdicts)

    # The workaround, captured: only what broker 0 coordinates works, and verify says so
    # (new groups and ids: the ones above committed their offsets and transactions).
    groups = {n: g for n, (g,) in apache_kafka.groups_by_coordinator(1, f"{topic}-f").items()}
    ids = {n: t for n, (t,) in apache_kafka.groups_by_coordinator(
        1, f"{topic}-u", transactional=True).items()}  # fmt: skip
    only_broker_0s_work_through_one_forward(
        apache_kafka, tmp_path / "one-forward.pcap", topic, groups, ids, expected
    )


def only_broker_0s_work_through_one_forward(
    kafka: ApacheKafka,
    capture: Path,
    topic: str,
    groups: dict[int, str],
    ids: dict[int, str],
    expected: int,
) -> None:
    """The workaround, captured by tcpdump: a group and a transactional id per coordinator
    at once, through one forward to broker 0. Only broker 0's read and commit; the others
    meet NOT_COORDINATOR, and verify --strict names them misrouted on the capture."""
    with OneForward(kafka, capture) as forward:

        def consume(group: str) -> str:
            out = forward.run(*WORKLOAD, "consume", forward.bootstrap, group, topic,
                              str(expected), "20")  # fmt: skip
            return out.stdout.strip()

        def transact(transactional_id: str) -> str:
            out = forward.run(*WORKLOAD, "transact", forward.bootstrap, topic, transactional_id,
                              "3", "20")  # fmt: skip
            return out.stdout.strip()

        with ThreadPoolExecutor(6) as pool:  # the groups and transactions at once
            consuming = pool.map(consume, groups.values())
            transacting = pool.map(transact, ids.values())
            consumed = dict(zip(groups, consuming, strict=True))
            committed = dict(zip(ids, transacting, strict=True))
    assert consumed[0].startswith(f"CONSUMED {expected} NOT_COORDINATOR 0"), consumed
    assert committed[0] == "COMMITTED 3", committed
    for node in (1, 2):
        assert consumed[node].startswith("CONSUMED 0 NOT_COORDINATOR"), consumed
        assert not consumed[node].endswith("NOT_COORDINATOR 0"), consumed
        assert committed[node].startswith("FAILED"), committed
    code, verdicts, said = verify(capture, "--strict")
    assert code != 0, said
    assert verdicts[groups[0]] == "ok" and verdicts[ids[0]] == "ok", verdicts
    for node in (1, 2):
        assert verdicts[groups[node]] == "misrouted", (node, verdicts)
        assert verdicts[ids[node]] == "misrouted", (node, verdicts)
        assert groups[node] in said and ids[node] in said, said
