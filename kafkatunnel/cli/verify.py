"""`kafkatunnel verify`: check the routing of every group in recordings, on Spark."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kafkatunnel.cli.output import error, make_console
from kafkatunnel.hostnames import split_address

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kafkatunnel.verify.job import Report

SPARK_PORT = 7077  # a spark:// master's, when its URL names none


def verify(
    paths: list[str] = typer.Argument(
        None,
        metavar="PATH...",
        help="Recordings: pcap/pcapng files, directories, or Hadoop URIs (hdfs://..., "
        "s3a://bucket/prefix/ with the usual AWS variables and files).",
    ),
    master: str = typer.Option(
        "local[*]", metavar="URL", help="Spark master URL (spark://host:7077, ...)."
    ),
    json_file: str | None = typer.Option(
        None, "--json", metavar="FILE", help="Write the report as JSON to this file (- for stdout)."
    ),
    html_file: str | None = typer.Option(
        None, "--html", metavar="FILE", help="Write a one-file HTML report."
    ),
    junit_file: str | None = typer.Option(
        None,
        "--junit",
        metavar="FILE",
        help="Write a JUnit XML report (a test case per group) for CI systems to show.",
    ),
    in_process: bool = typer.Option(False, help="Run without Spark, a process per core."),
    replay_against: str | None = typer.Option(
        None,
        metavar="HOST:PORT",
        help="A running tunnel's HOST:PORT: re-issue read-only look-ups for every group.",
    ),
    broker: list[str] = typer.Option(
        [],
        "--broker",
        metavar="ADDRESS=NODE",
        help="The broker behind a captured server address, e.g. 127.0.0.3:9092=2 (repeatable).",
    ),
    strict: bool = typer.Option(
        False,
        help="Also fail when a group is unverified, nothing was checked, or a file is cut short.",
    ),
) -> None:
    """Did every consumer group and transactional id talk to its coordinator? Exit 0 only
    when nothing is misrouted or leaked (with --strict: and everything was checked)."""
    check_master(master)
    if replay_against is not None:
        check_addresses(replay_against, "--replay-against")
    raise typer.Exit(
        run_verify(make_console(), paths or [], master, Outputs(json_file, html_file, junit_file),
                   in_process, replay_against, parse_brokers(broker), strict)
    )  # fmt: skip


class Outputs(NamedTuple):
    """Where the report goes besides the terminal."""

    json_file: str | None = None  # "-": standard output
    html_file: str | None = None
    junit_file: str | None = None

    def files(self) -> list[tuple[str, str]]:
        """(flag, path) of each file to write."""
        named = (("--json", self.json_file), ("--html", self.html_file),
                 ("--junit", self.junit_file))  # fmt: skip
        return [(flag, target) for flag, target in named if target is not None and target != "-"]


def parse_brokers(entries: list[str]) -> dict[str, int]:
    """--broker ADDRESS=NODE entries as address -> node, each address HOST:PORT as every
    other flag's (an IPv6 host in brackets: verify shows captured addresses so)."""
    from kafkatunnel.verify.identity import parse_broker_entries

    try:
        brokers = parse_broker_entries(entries)
        for address in brokers:
            split_address(address)
    except ValueError as cause:
        raise typer.BadParameter(str(cause), param_hint="--broker") from None
    return brokers


def check_addresses(addresses: str, flag: str) -> None:
    """HOST:PORT[,HOST:PORT...], each read as every address flag's, before any work."""
    for address in addresses.split(","):
        try:
            split_address(address.strip())
        except ValueError as cause:
            raise typer.BadParameter(f"{cause}; expected HOST:PORT, e.g. 127.0.0.1:9092",
                                     param_hint=flag) from None  # fmt: skip


def check_master(master: str) -> None:
    """A spark:// master's HOST[:PORT]s (standby masters after commas), read before any
    work: Spark would try a bad one for a minute, and urllib raises on `spark://[::1`."""
    if not master.startswith("spark://"):
        return  # local[*], yarn, k8s://...: Spark's own to read
    for address in master.removeprefix("spark://").rstrip("/").split(","):
        try:
            split_address(address, default_port=SPARK_PORT)
        except ValueError as cause:
            raise typer.BadParameter(
                f"{master!r}: {cause}; expected spark://HOST:PORT, e.g. spark://spark-master:7077",
                param_hint="--master",
            ) from None


def run_verify(
    console: Console,
    paths: list[str],
    master: str,
    outputs: Outputs,
    in_process: bool,
    replay_against: str | None,
    brokers: dict[str, int] | None = None,
    strict: bool = False,
) -> int:
    from kafkatunnel.verify.failures import master_problem, spark_errors
    from kafkatunnel.verify.job import (
        expand,
        is_uri,
        spark_problem,
        spark_session,
        verify_local,
        verify_spark,
    )
    from kafkatunnel.verify.objectstore import ObjectStoreError, object_store_settings
    from kafkatunnel.verify.replay import replay
    from kafkatunnel.verify.report import (
        address_table,
        final_line,
        summary_lines,
        table,
        verdict_of_run,
        write_reports,
    )

    if not paths:
        raise typer.BadParameter("name at least one recording (file, directory or URI)")
    try:
        files = expand(paths)
    except FileNotFoundError as cause:
        raise typer.BadParameter(str(cause), param_hint="PATHS") from None
    if not files:
        raise typer.BadParameter(
            "no .pcap or .pcapng files there (record with `kafkatunnel up --record DIR`)",
            param_hint="PATHS",
        )
    remote = [f for f in files if is_uri(f)]
    if in_process and remote:
        raise typer.BadParameter(f"{remote[0]}: --in-process reads local files only; "
                                 "read URIs through Spark (drop --in-process)",
                                 param_hint="--in-process")  # fmt: skip
    try:
        settings = object_store_settings(files)
    except ObjectStoreError as cause:
        raise typer.BadParameter(str(cause), param_hint="PATHS") from None
    for flag, target in outputs.files():
        _check_writable(Path(target), flag)
    if outputs.json_file == "-":  # standard output is the JSON's alone: the rest goes to stderr
        console = make_console(stderr=True)
    spark = None
    spark_log = None
    if in_process:
        report: Report = verify_local(files, brokers)
    else:
        problem = spark_problem()
        if problem is not None:
            error(problem, "install what Spark needs, or verify without Spark: --in-process")
            return 2
        unreachable = master_problem(master)
        if unreachable is not None:
            error(unreachable.cause, unreachable.fix)
            return 2
        spark_log = Path(tempfile.mkstemp(prefix="kafkatunnel-spark-", suffix=".log")[1])
        try:
            spark = spark_session(master, log=spark_log, settings=settings)
            report = verify_spark(files, spark, brokers)
        except spark_errors() as failure:
            return _spark_failed(failure, spark, master, spark_log)
    console.print(table(report))
    addresses = address_table(report)
    if addresses is not None:
        console.print(addresses)
    for line in summary_lines(report):
        # these lines quote the recording (group ids, addresses): text, never markup
        console.print(line, style="bold red" if "NOTHING" in line else None, soft_wrap=True,
                      markup=False, highlight=False)  # fmt: skip
    problems, failed = verdict_of_run(report, strict)
    for problem in problems:
        console.print(problem, style="red", soft_wrap=True, markup=False, highlight=False)
    if replay_against:
        keys = sorted({(v.key, v.key_type) for v in report.verdicts})
        try:
            results = replay(keys, replay_against, spark)
        except Exception as failure:  # a Spark job of its own: it fails as verify's does
            if spark is None or spark_log is None or not isinstance(failure, spark_errors()):
                raise
            return _spark_failed(failure, spark, master, spark_log)
        replayed = Table(title=f"replayed look-ups against {replay_against}", title_justify="left")
        for column in ("key", "coordinator", "checked with", "result"):
            replayed.add_column(column)
        for result in results:
            outcome = (
                "[green]ok[/]" if result["ok"] else f"[red]{escape(str(result.get('error')))}[/]"
            )
            replayed.add_row(
                escape(result["key"]), str(result.get("coordinator")),
                str(result.get("checked_with") or "FindCoordinator"), outcome,
            )  # fmt: skip
        console.print(replayed)
        failed = failed or not all(r["ok"] for r in results)
    last = final_line(report, failed)
    console.print(last, style="green" if last == "verify: ok" else "bold red", soft_wrap=True)
    write_reports(report, outputs.json_file, outputs.html_file, outputs.junit_file, strict)
    if spark is not None:
        spark.stop()
        console.print(f"Spark's own log: {spark_log}", highlight=False, soft_wrap=True)
    return 1 if failed else 0


def _spark_failed(
    failure: BaseException, spark: SparkSession | None, master: str, log: Path
) -> int:
    """Say why the Spark job failed and what to do, the Java stack kept in Spark's log:
    exit status 2 when the cause is the user's (as for other bad input), 70 when it is
    not recognised (as for anything else that escapes)."""
    from kafkatunnel.verify.failures import explain, java_causes

    explained = explain(java_causes(failure), master)
    with contextlib.suppress(OSError), log.open("a") as out:
        out.write(f"\nkafkatunnel verify: the Spark job failed:\n{failure}\n")
    if spark is not None:
        with contextlib.suppress(Exception):  # the JVM may be gone already
            spark.stop()
    error(explained.cause, f"{explained.fix}; the whole Java stack is in {log}")
    return 2 if explained.known else 70


def _check_writable(path: Path, flag: str) -> None:
    """Fail before the work, not after it, when the report cannot be written."""
    try:
        with path.open("a"):
            pass
    except OSError as cause:
        raise typer.BadParameter(
            f"cannot write {path}: {cause.strerror or cause}", param_hint=flag
        ) from None
