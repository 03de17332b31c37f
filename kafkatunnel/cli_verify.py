"""`kafkatunnel verify`: check the routing of every group in recordings, on Spark."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from kafkatunnel.verify.job import (
    Report,
    expand,
    spark_problem,
    spark_session,
    verify_local,
    verify_spark,
)
from kafkatunnel.verify.replay import replay
from kafkatunnel.verify.report import summary_lines, table, write_reports


def run_verify(
    console: Console,
    paths: list[str],
    master: str,
    json_file: str | None,
    html_file: str | None,
    in_process: bool,
    replay_against: str | None,
) -> int:
    if not paths:
        raise typer.BadParameter("name at least one recording (file, directory or URI)")
    try:
        files = expand(paths)
    except FileNotFoundError as error:
        raise typer.BadParameter(str(error), param_hint="PATHS") from None
    if not files:
        raise typer.BadParameter(
            "no .pcap or .pcapng files there (record with `kafkatunnel up --record DIR`)",
            param_hint="PATHS",
        )
    spark = None
    if not in_process:
        problem = spark_problem()
        if problem is not None:
            console.print(f"[red]error:[/] {problem}, or verify without Spark: --in-process")
            return 2
        spark = spark_session(master)
    report: Report = verify_local(files) if spark is None else verify_spark(files, spark)
    console.print(table(report))
    for line in summary_lines(report):
        console.print(line, style="green" if line == "verify: ok" else None, soft_wrap=True)
    failed = not report.ok
    if replay_against:
        keys = sorted({(v.key, v.key_type) for v in report.verdicts})
        results = replay(keys, replay_against, spark)
        replayed = Table(title=f"replayed look-ups against {replay_against}", title_justify="left")
        for column in ("key", "coordinator", "checked with", "result"):
            replayed.add_column(column)
        for result in results:
            outcome = "[green]ok[/]" if result["ok"] else f"[red]{result.get('error')}[/]"
            replayed.add_row(
                result["key"], str(result.get("coordinator")),
                str(result.get("checked_with") or "FindCoordinator"), outcome,
            )  # fmt: skip
        console.print(replayed)
        failed = failed or not all(r["ok"] for r in results)
    write_reports(report, json_file, html_file)
    if spark is not None:
        spark.stop()
    return 1 if failed else 0
