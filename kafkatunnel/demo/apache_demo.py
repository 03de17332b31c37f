"""`kafkatunnel demo --cluster apache`: the problem and its fix on Apache Kafka itself.

The same four steps as the embedded demo (kafkatunnel.demo.embedded_demo), on Apache
Kafka: three KRaft nodes advertising `kafka-N.kafka-headless.kafka.svc.cluster.local`.
Without the tunnel, the field report's workaround: a laptop whose hosts file sends every
broker name to one forward to kafka-0, captured with tcpdump. Then the tunnel, recording,
and verify on both.
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.rule import Rule
from rich.table import Table

from kafkatunnel.demo import free_port_run
from kafkatunnel.demo.apache import KAFKA_VERSION, ApacheKafka, OneForward
from kafkatunnel.demo.embedded_demo import (
    GROUPS_PER_BROKER,
    MESSAGES,
    DemoReport,
    _consume_showing_table,
    _groups_table,
    _summary,
    _verify,
)
from kafkatunnel.demo.workload import GroupResult, produce
from kafkatunnel.tunnel import ExecForwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel

WORKLOAD = [sys.executable, "-m", "kafkatunnel.demo.workload"]
STUCK_AFTER = 15  # seconds a consumer through the one forward is given


def run_apache_demo(
    console: Console, record_dir: Path | None = None, spark: bool = True
) -> DemoReport:
    console.print(Rule("[bold]kafkatunnel demo: Apache Kafka"),
                  width=console.width if console.is_terminal else 80)  # fmt: skip
    recordings = record_dir or Path(tempfile.mkdtemp(prefix="kafkatunnel-demo-"))
    control = recordings / "single-forward.pcap"
    console.print(f"Starting Apache Kafka {KAFKA_VERSION} (three KRaft nodes) ...")
    with ApacheKafka() as kafka:
        report = DemoReport(isolated=True, recording=recordings / "tunnel")
        console.print(_cluster_table(kafka))
        topic = f"demo-{uuid.uuid4().hex[:6]}"
        kafka.tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                   kafka.bootstrap(), "--create", "--topic", topic,
                   "--replica-assignment", "0:1:2")  # fmt: skip
        spread = kafka.groups_by_coordinator(GROUPS_PER_BROKER, prefix=f"{topic}-g")
        owner = {g: node for node, groups in spread.items() for g in groups}
        produced = kafka.inside([*WORKLOAD, "produce", kafka.bootstrap(), topic, str(MESSAGES)])
        _run(produced)

        console.print(
            f"\n[bold]Without the tunnel.[/] {MESSAGES} messages are in {topic} (its leader: "
            "broker 0). Every broker name leads to broker 0, as one `kubectl port-forward "
            "kafka-0 9092` and a hosts entry per name would do:"
        )
        recordings.mkdir(parents=True, exist_ok=True)
        with OneForward(kafka, control) as forward:

            def consume(group: str) -> GroupResult:
                said = forward.run(*WORKLOAD, "consume", forward.bootstrap, group, topic,
                                   str(MESSAGES), str(STUCK_AFTER)).stdout.split()  # fmt: skip
                result = GroupResult(group, MESSAGES)
                if len(said) >= 4 and said[0] == "CONSUMED":  # CONSUMED n NOT_COORDINATOR m
                    result.consumed = int(said[1])
                    result.coordinator_errors = ["Not coordinator"] * int(said[3])
                return result

            with ThreadPoolExecutor(len(owner)) as pool:
                report.without_tunnel = dict(zip(owner, pool.map(consume, owner), strict=True))
        console.print(_groups_table("Without the tunnel", report.without_tunnel, owner))

        config = TunnelConfig(bootstrap=kafka.bootstrap(), listen_port=free_port_run(8),
                              control=False, record_dir=report.recording)  # fmt: skip
        with BackgroundTunnel(config, ExecForwarder(kafka.exec_template())) as tunnel:
            console.print(
                f"\n[bold]With the tunnel.[/] bootstrap.servers={tunnel.bootstrap_servers}; "
                f"recording to {report.recording}; producing and consuming with every group "
                "at once:"
            )
            produce(tunnel.bootstrap_servers, topic, MESSAGES, prefix="t")
            done = {g for g, r in report.without_tunnel.items() if r.consumed == MESSAGES}
            expected = {g: MESSAGES if g in done else 2 * MESSAGES for g in owner}
            report.with_tunnel = _consume_showing_table(console, tunnel, expected, topic)
            console.print(_groups_table("With the tunnel", report.with_tunnel, owner))
    _verify(console, report, control if control.exists() else None, spark)
    _summary(console, report)
    return report


def _run(argv: list[str]) -> None:
    import subprocess

    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[-5:])}: {result.stderr[-2000:]}")


def _cluster_table(kafka: ApacheKafka) -> Table:
    table = Table(title="The cluster, as its brokers advertise themselves", title_justify="left")
    for column in ("node", "advertised address", "broker"):
        table.add_column(column)
    for broker in kafka.brokers():
        table.add_row(str(broker.node_id), broker.address, f"Apache Kafka {KAFKA_VERSION}")
    return table
