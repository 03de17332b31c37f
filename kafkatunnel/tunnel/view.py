"""The live table, rendered from the same status dict that `status --json` prints."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def status_table(status: dict[str, Any]) -> Table:
    table = Table(
        title=f"kafkatunnel  bootstrap.servers={status['bootstrap_servers']}  via {status['via']}",
        title_justify="left",
    )
    for column, justify in (
        ("node", "right"), ("advertised", "left"), ("tunnel", "left"), ("forward", "left"),
        ("conns", "right"), ("in", "right"), ("out", "right"), ("errors", "right"),
    ):  # fmt: skip
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for e in status["endpoints"]:
        node = "bootstrap" if e["node_id"] is None else str(e["node_id"])
        state = e["state"] if e["state"] != "listening" else "[green]ok[/]"
        errors = str(e["errors"])
        if e["last_error"]:
            errors = f"[red]{e['errors']}[/] {e['last_error']}"
        table.add_row(
            node, e["advertised"], e["tunnel"], state, str(e["connections"]),
            _bytes(e["bytes_in"]), _bytes(e["bytes_out"]), errors,
        )  # fmt: skip
    for note in status.get("notes", []):
        table.caption = note
    return table
