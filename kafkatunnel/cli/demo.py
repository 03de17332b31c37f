"""`kafkatunnel demo`: the problem and its fix on the embedded local cluster (the library
side is kafkatunnel.localcluster.demo)."""

from __future__ import annotations

from pathlib import Path

import typer

from kafkatunnel.cli.output import make_console


def demo(
    record_dir: str | None = typer.Option(
        None, metavar="DIR", help="Keep the recordings here (default: a new temporary directory)."
    ),
    spark: bool = typer.Option(True, help="Verify with Spark (--no-spark: in one process)."),
) -> None:
    """Bring up the embedded local cluster, show the problem and the fix, and verify the
    recorded traffic."""
    from kafkatunnel.localcluster.demo import run_demo

    report = run_demo(make_console(), Path(record_dir) if record_dir else None, spark)
    raise typer.Exit(0 if report.ok else 1)
