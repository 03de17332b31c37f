"""`kafkatunnel demo`: the problem and its fix on the embedded local cluster (the library
side is kafkatunnel.demo.embedded_demo)."""

from __future__ import annotations

from pathlib import Path

import typer

from kafkatunnel.cli.output import error, make_console


def demo(
    record_dir: str | None = typer.Option(
        None, metavar="DIR", help="Keep the recordings here (default: a new temporary directory)."
    ),
    spark: bool = typer.Option(True, help="Verify with Spark (--no-spark: in one process)."),
    cluster: str = typer.Option(
        "embedded",
        metavar="KIND",
        help="embedded (librdkafka's mock brokers and tansu, quick) or apache (Apache Kafka "
        "itself, three KRaft nodes; its jars fetched by scripts/demo --cluster apache).",
    ),
) -> None:
    """Bring up a local cluster, show the problem and the fix, and verify the recorded
    traffic."""
    console = make_console()
    keep = Path(record_dir) if record_dir else None
    if cluster == "embedded":
        from kafkatunnel.demo.embedded_demo import run_demo

        report = run_demo(console, keep, spark)
    elif cluster == "apache":
        from kafkatunnel.demo.apache import ApacheKafkaUnavailable, kafka_lib
        from kafkatunnel.demo.apache_demo import run_apache_demo

        try:
            kafka_lib()
        except ApacheKafkaUnavailable as cause:
            error(str(cause), "run scripts/demo --cluster apache, which fetches it")
            raise typer.Exit(2) from None
        report = run_apache_demo(console, keep, spark)
    else:
        raise typer.BadParameter(f"{cluster!r} is not embedded or apache", param_hint="--cluster")
    raise typer.Exit(0 if report.ok else 1)
