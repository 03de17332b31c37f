"""`kafkatunnel demo`: the problem and its fix, on the embedded local cluster.

1. An isolated cluster: three brokers whose advertised addresses are unreachable from here.
2. The usual workaround, every broker name forwarded to one broker: groups coordinated by
   any other broker get NOT_COORDINATOR and consume nothing.
3. The tunnel, recording: the same groups, and new ones, all consume everything, while the
   live table shows each broker's forward and traffic.
4. verify, a PySpark job, on the recording: every group ok. On the control's capture (taken
   with dumpcap) it names the misrouted groups.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.rule import Rule
from rich.table import Table

from kafkatunnel.capture.dumpcap import Dumpcap
from kafkatunnel.demo import LocalCluster, free_port_run
from kafkatunnel.demo.single_forward import SingleForward
from kafkatunnel.demo.workload import GroupResult, consume_group, consume_groups, produce
from kafkatunnel.tunnel import DirectForwarder, ExecForwarder, Forwarder, TunnelConfig
from kafkatunnel.tunnel.background import BackgroundTunnel
from kafkatunnel.tunnel.view import status_table
from kafkatunnel.verify.job import Report
from kafkatunnel.verify.judge import MISROUTED, OK
from kafkatunnel.verify.report import address_table, final_line, summary_lines
from kafkatunnel.verify.report import table as report_table

MESSAGES = 50
GROUPS_PER_BROKER = 2


@dataclass
class DemoReport:
    isolated: bool
    skipped: list[str] = field(default_factory=list)
    without_tunnel: dict[str, GroupResult] = field(default_factory=dict)
    with_tunnel: dict[str, GroupResult] = field(default_factory=dict)
    recording: Path | None = None
    verified: Report | None = None  # verify on the tunnel's recording
    control_verified: Report | None = None  # verify on the single-forward capture

    @property
    def verify_ok(self) -> bool:
        if self.verified is None:
            return False
        groups = [v for v in self.verified.verdicts if v.key in self.with_tunnel]
        every_group = len(groups) == len(self.with_tunnel) and all(v.verdict == OK for v in groups)
        control = self.control_verified
        caught = control is None or any(v.verdict == MISROUTED for v in control.verdicts)
        return self.verified.ok and every_group and caught

    @property
    def control_reproduced(self) -> bool:
        return not self.isolated or any(r.not_coordinator for r in self.without_tunnel.values())

    @property
    def ok(self) -> bool:
        return (
            bool(self.with_tunnel)
            and all(r.ok for r in self.with_tunnel.values())
            and self.control_reproduced
            and self.verify_ok
        )


def _groups_table(title: str, results: dict[str, GroupResult], owner: dict[str, int]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("group", "coordinator", "consumed", "NOT_COORDINATOR seen", "result"):
        table.add_column(column)
    for group, r in results.items():
        verdict = "[green]ok[/]" if r.ok else "[red]failed[/]"
        table.add_row(
            group,
            f"broker {owner[group]}",
            f"{r.consumed}/{r.expected}",
            str(r.not_coordinator),
            verdict,
        )
    return table


def _cluster_table(cluster: LocalCluster) -> Table:
    table = Table(
        title="The local cluster, as its brokers advertise themselves", title_justify="left"
    )
    for column in ("node", "advertised address", "broker"):
        table.add_column(column)
    for b in cluster.mock:
        table.add_row(str(b.node_id), b.address, "librdkafka mock broker")
    if cluster.tansu:
        table.add_row(str(cluster.tansu.node_id), cluster.tansu.address, "tansu broker")
    return table


def run_demo(console: Console, record_dir: Path | None = None, spark: bool = True) -> DemoReport:
    # a rule fills the width it is given: off a terminal, that of a plain line
    console.print(
        Rule("[bold]kafkatunnel demo"), width=console.width if console.is_terminal else 80
    )
    recordings = record_dir or Path(tempfile.mkdtemp(prefix="kafkatunnel-demo-"))
    control_capture = recordings / "single-forward.pcapng"
    with LocalCluster() as cluster:
        report = DemoReport(isolated=cluster.isolated, recording=recordings / "tunnel")
        console.print(_cluster_table(cluster))
        if cluster.isolation_note:
            console.print(f"[yellow]{cluster.isolation_note}[/]")

        topic = f"demo-{uuid.uuid4().hex[:6]}"
        leader = cluster.broker(cluster.partition_leaders(topic)[0])
        spread = cluster.groups_by_coordinator(GROUPS_PER_BROKER, prefix=f"{topic}-g")
        owner = {g: node for node, groups in spread.items() for g in groups}

        if cluster.isolated:
            cluster.produce_inside(topic, MESSAGES, partition=0)
            console.print(
                f"\n[bold]Without the tunnel.[/] {MESSAGES} messages are in {topic}. Every broker "
                f"address is forwarded to broker {leader.node_id} only, as one "
                "`kubectl port-forward` and a hosts entry would do:"
            )
            capture: AbstractContextManager[object] = nullcontext()
            if shutil.which("dumpcap"):
                capture = Dumpcap(control_capture, [b.port for b in cluster.mock])
            else:
                report.skipped.append("capturing the control: dumpcap (tshark) is missing")
            with capture, SingleForward(cluster, leader):
                report.without_tunnel = consume_groups(
                    leader.address,
                    dict.fromkeys(owner, MESSAGES),
                    topic,
                    timeout=30,
                    stop_after_coordinator_errors=3,
                )
            console.print(_groups_table("Without the tunnel", report.without_tunnel, owner))
        else:
            report.skipped.append("the single-forward control: it needs network isolation (root)")
            console.print(f"[yellow]skipped: {report.skipped[-1]}[/]")

        forwarder: Forwarder
        if cluster.isolated:
            forwarder = ExecForwarder(cluster.exec_template())
        else:
            forwarder = DirectForwarder(
                {
                    tuple(k.rsplit(":", 1)): tuple(v.rsplit(":", 1))  # type: ignore[misc]
                    for k, v in cluster.direct_map().items()
                }
            )
        config = TunnelConfig(
            bootstrap=cluster.mock[0].address,
            listen_port=free_port_run(8),
            control=False,
            record_dir=report.recording,
        )
        with BackgroundTunnel(config, forwarder) as tunnel:
            console.print(
                f"\n[bold]With the tunnel.[/] bootstrap.servers={tunnel.bootstrap_servers}; "
                f"recording to {report.recording}; producing and consuming with every group "
                "at once:"
            )
            already = set(spread[leader.node_id]) if cluster.isolated else set()
            produce(tunnel.bootstrap_servers, topic, MESSAGES, prefix="t")
            total = MESSAGES * 2 if cluster.isolated else MESSAGES
            expected = {g: (MESSAGES if g in already else total) for g in owner}
            report.with_tunnel = _consume_showing_table(console, tunnel, expected, topic)
            console.print(_groups_table("With the tunnel", report.with_tunnel, owner))
    _verify(console, report, control_capture if control_capture.exists() else None, spark)
    _summary(console, report)
    return report


def _verify(console: Console, report: DemoReport, control: Path | None, spark: bool) -> None:
    """verify, the PySpark job, on the tunnel's recording and on the control's capture."""
    from kafkatunnel.verify.job import spark_problem, spark_session, verify_local, verify_spark

    assert report.recording is not None
    problem = spark_problem() if spark else "Spark was not asked for"
    session = None
    if problem is None:
        log = report.recording.parent / "spark.log"
        console.print(f"\n[bold]Verifying the recordings[/] with Spark (local[*]; its own log: "
                      f"{log}) ...", soft_wrap=True)  # fmt: skip
        session = spark_session("local[*]", log=log)
    else:
        report.skipped.append(f"Spark ({problem}): verified in one process instead")
        console.print(f"[yellow]skipped: {report.skipped[-1]}[/]")
    try:
        for title, path in (("the tunnel's recording", report.recording),
                            ("the single forward's capture", control)):  # fmt: skip
            if path is None:
                continue
            result = verify_local([str(path)]) if session is None else (
                verify_spark([str(path)], session))  # fmt: skip
            if path == report.recording:
                report.verified = result
            else:
                report.control_verified = result
            console.print(f"\n[bold]kafkatunnel verify {path}[/] ({title})")
            console.print(report_table(result))
            addresses = address_table(result)
            if addresses is not None and not result.tunnel_recording:
                console.print(addresses)  # the broker behind the forward, from its traffic
            for line in summary_lines(result):
                console.print(line, soft_wrap=True)
            last = final_line(result, failed=not result.ok)
            if last == "verify: FAILED" and path == control:
                last += " (as it must: this capture is the failure the tunnel removes)"
            console.print(last, soft_wrap=True)
    finally:
        if session is not None:
            session.stop()


def _consume_showing_table(
    console: Console, tunnel: BackgroundTunnel, expected: dict[str, int], topic: str
) -> dict[str, GroupResult]:
    done = threading.Event()
    with ThreadPoolExecutor(max_workers=len(expected)) as pool:
        futures: dict[str, Future[GroupResult]] = {
            g: pool.submit(consume_group, tunnel.bootstrap_servers, g, topic, n, timeout=60)
            for g, n in expected.items()
        }
        if console.is_terminal:
            with Live(status_table(tunnel.status()), console=console, refresh_per_second=4) as live:
                while not done.wait(0.25):
                    live.update(Group(status_table(tunnel.status())))
                    if all(f.done() for f in futures.values()):
                        done.set()
        else:  # a log: no redrawn table, the table once the groups are done
            wait(futures.values())
            console.print(status_table(tunnel.status(), cut=False))
        return {g: f.result() for g, f in futures.items()}


def _summary(console: Console, report: DemoReport) -> None:
    if report.without_tunnel:
        failed = [g for g, r in report.without_tunnel.items() if r.not_coordinator]
        console.print(
            f"Without the tunnel: {len(failed)} of {len(report.without_tunnel)} groups stuck "
            "on NOT_COORDINATOR."
        )
    good = [g for g, r in report.with_tunnel.items() if r.ok]
    console.print(
        f"With the tunnel: {len(good)} of {len(report.with_tunnel)} groups consumed everything."
    )
    if report.verified is not None:
        ok = sum(v.verdict == OK for v in report.verified.verdicts if v.key in report.with_tunnel)
        console.print(
            f"verify on the tunnel's recording: {ok} of {len(report.with_tunnel)} groups ok"
            + (", no leaked address" if not report.verified.leaks else ", LEAKED ADDRESSES")
        )
    if report.control_verified is not None:
        caught = [v.key for v in report.control_verified.verdicts if v.verdict == MISROUTED]
        console.print(
            f"verify on the single forward's capture: {len(caught)} groups misrouted "
            "(as expected: this is the failure the tunnel removes)"
        )
    console.print(f"Recordings kept in {report.recording.parent if report.recording else '-'} "
                  "(open them in Wireshark, or run `kafkatunnel verify` on them).")  # fmt: skip
    if report.ok:
        console.print("[bold green]demo ok[/]")
    else:
        console.print("[bold red]demo failed[/]")
