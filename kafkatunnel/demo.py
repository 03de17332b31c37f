"""`kafkatunnel demo`: the problem and its fix, shown on the embedded local cluster."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from kafkatunnel.localcluster import LocalCluster
from kafkatunnel.localcluster.single_forward import SingleForward
from kafkatunnel.workload import GroupResult, consume_group

MESSAGES = 50
GROUPS_PER_BROKER = 2


@dataclass
class DemoReport:
    isolated: bool
    skipped: list[str] = field(default_factory=list)
    without_tunnel: list[GroupResult] = field(default_factory=list)
    with_tunnel: list[GroupResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.with_tunnel)


def _group_table(title: str, results: list[GroupResult], owner: dict[str, int]) -> Table:
    table = Table(title=title)
    for column in ("group", "coordinator", "consumed", "NOT_COORDINATOR", "verdict"):
        table.add_column(column)
    for r in results:
        verdict = "[green]ok[/]" if r.ok else "[red]failed[/]"
        table.add_row(
            r.group,
            f"broker {owner[r.group]}",
            f"{r.consumed}/{r.expected}",
            str(r.not_coordinator),
            verdict,
        )
    return table


def run_demo(console: Console) -> DemoReport:
    console.rule("kafkatunnel demo")
    with LocalCluster() as cluster:
        report = DemoReport(isolated=cluster.isolated)
        if cluster.isolation_note:
            console.print(f"[yellow]{cluster.isolation_note}[/]")
        brokers = Table(title="The local cluster (as its brokers advertise themselves)")
        brokers.add_column("node")
        brokers.add_column("advertised address")
        brokers.add_column("kind")
        for b in cluster.mock:
            brokers.add_row(str(b.node_id), b.address, "librdkafka mock broker")
        if cluster.tansu:
            brokers.add_row(str(cluster.tansu.node_id), cluster.tansu.address, "tansu broker")
        console.print(brokers)
        if not cluster.isolated:
            report.skipped.append(
                "the single-port-forward control (needs root for network namespaces)"
            )
            console.print("[yellow]skipping the NOT_COORDINATOR control: needs isolation[/]")
            return report

        topic = f"demo-{uuid.uuid4().hex[:6]}"
        leader = cluster.broker(cluster.partition_leaders(topic)[0])
        cluster.produce_inside(topic, MESSAGES, partition=0)
        spread = cluster.groups_by_coordinator(GROUPS_PER_BROKER, prefix=f"{topic}-g")
        owner = {g: node for node, groups in spread.items() for g in groups}
        console.print(
            f"\nProduced {MESSAGES} messages to {topic}. Now forward every broker address to "
            f"broker {leader.node_id} only, like one `kubectl port-forward`:"
        )
        with SingleForward(cluster, leader):
            for group in owner:
                report.without_tunnel.append(
                    consume_group(
                        leader.address,
                        group,
                        topic,
                        MESSAGES,
                        timeout=20,
                        stop_after_coordinator_errors=3,
                    )
                )
        console.print(_group_table("Without the tunnel", report.without_tunnel, owner))
        return report
