"""`kafkatunnel config show`: the effective settings of `up` or `doctor`, and where each
came from (flag, environment, profile or default)."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup as Group

from kafkatunnel.cli.options import json_option
from kafkatunnel.cli.output import make_console
from kafkatunnel.cli.settings import CONFIGURABLE, settings_of

app = typer.Typer(help="Where the settings of `up` and `doctor` come from.")


@app.command("show", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def config_show(
    ctx: typer.Context,
    command: str = typer.Option(
        "up", metavar="up|doctor", help="The command whose settings to show."
    ),
    as_json: bool = json_option(),
) -> None:
    """The effective settings and where each came from (flag, environment, profile or
    default). Flags after `--` are taken as the command's own: `config show -- -n shop`."""
    if command not in CONFIGURABLE:
        raise typer.BadParameter(f"{command!r} is not one of {', '.join(CONFIGURABLE)}")
    show(ctx, make_console(), command, list(ctx.args), as_json)


SOURCES = {  # click's ParameterSource names (typer keeps the enum private)
    "COMMANDLINE": "flag",
    "ENVIRONMENT": "environment",
    "DEFAULT_MAP": "profile",
    "DEFAULT": "default",
}


def effective(ctx: typer.Context, command_name: str, args: list[str]) -> list[dict[str, Any]]:
    """Each setting of a command as `command ARGS` would get it, and where it came from."""
    root = ctx.find_root()
    group = root.command
    assert isinstance(group, Group)
    command = group.commands[command_name]
    sub = command.make_context(command_name, list(args), parent=root, resilient_parsing=True)
    chosen = root.obj
    rows = []
    for name, setting in settings_of(command).items():
        source = sub.get_parameter_source(name)
        where = SOURCES.get(source.name, "default") if source is not None else "default"
        detail = {
            "flag": f"--{setting.key}",
            "environment": setting.variable,
            "profile": getattr(chosen, "source", "profile"),
            "default": "built in",
        }[where]
        rows.append({"setting": setting.key, "value": sub.params.get(name), "source": where,
                     "from": detail})  # fmt: skip
    return rows


def show(
    ctx: typer.Context, console: Console, command_name: str, args: list[str], as_json: bool
) -> None:
    rows = effective(ctx, command_name, args)
    chosen = ctx.find_root().obj
    if as_json:
        profile = getattr(chosen, "name", None)
        typer.echo(json.dumps({"command": command_name, "profile": profile, "settings": rows},
                              indent=2, default=str))  # fmt: skip
        return
    profile = getattr(chosen, "name", None) or "none"
    title = f"kafkatunnel {command_name}: effective settings (profile: {profile})"
    table = Table(title=title, title_justify="left")
    for column in ("setting", "value", "from"):
        table.add_column(column, overflow="fold")
    for row in rows:
        style = None if row["source"] == "default" else "bold"
        table.add_row(row["setting"], escape(repr(row["value"])), escape(row["from"]), style=style)
    console.print(table)
