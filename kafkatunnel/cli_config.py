"""Profiles, environment variables and logging for the command line: the settings of `up`
and `doctor` come from kafkatunnel.toml, KAFKATUNNEL_* and flags (see kafkatunnel.config),
and `config show` says where each effective value came from."""

from __future__ import annotations

import json
import logging
import sys
import typing
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table
from typer._click.core import Command, Context, Parameter, ParameterSource
from typer.core import TyperGroup as Group

from kafkatunnel.config import ConfigError, Setting, check_environment, load_profile

CONFIGURABLE = ("up", "doctor")


def _setting(param: Parameter) -> Setting | None:
    longs = [opt for opt in param.opts if opt.startswith("--")]
    if not longs or param.name is None:
        return None
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", str)
    while typing.get_args(annotation):  # list[str], str | None: the element type
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    kind: type = annotation if annotation in (bool, int, float) else str
    if getattr(param, "is_flag", False):
        kind = bool
    return Setting(longs[0][2:], param.name, kind, bool(getattr(param, "multiple", False)))


def settings_of(command: Command) -> dict[str, Setting]:
    found = (_setting(param) for param in command.params)
    return {s.name: s for s in found if s is not None}


def all_settings(group: Group) -> dict[str, Setting]:
    out: dict[str, Setting] = {}
    for name in CONFIGURABLE:
        if name in group.commands:
            out |= settings_of(group.commands[name])
    return out


def add_environment_variables(group: Group) -> None:
    """Every setting of `up` and `doctor` can come from KAFKATUNNEL_<SETTING>."""
    for name in CONFIGURABLE:
        command = group.commands.get(name)
        if command is None:
            continue
        settings = settings_of(command)
        for param in command.params:
            if param.name in settings:
                param.envvar = settings[param.name].variable


def apply(ctx: typer.Context, config: Path | None, profile: str | None) -> None:
    """Load the profile into the commands' defaults (below env and flags), or exit 2."""
    group = ctx.command
    assert isinstance(group, Group)
    settings = all_settings(group)
    try:
        check_environment(settings)
        chosen = load_profile(settings, config, profile)
    except ConfigError as error:
        Console(stderr=True).print(f"[red]error:[/] {escape(str(error))}")
        raise typer.Exit(2) from None
    defaults: dict[str, Any] = {}
    for name in CONFIGURABLE:
        if name in group.commands:
            own = settings_of(group.commands[name])
            defaults[name] = {k: v for k, v in chosen.values.items() if k in own}
    ctx.default_map = defaults
    ctx.obj = chosen


def configure_logging(verbose: int, quiet: bool) -> None:
    level = (
        logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    )
    handler: logging.Handler
    if sys.stderr.isatty():
        handler = RichHandler(console=Console(stderr=True), show_path=False)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:  # a log file or a pipe: one line per record
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


SOURCES = {
    ParameterSource.COMMANDLINE: "flag",
    ParameterSource.ENVIRONMENT: "environment",
    ParameterSource.DEFAULT_MAP: "profile",
    ParameterSource.DEFAULT: "default",
}


def effective(ctx: Context, command_name: str, args: list[str]) -> list[dict[str, Any]]:
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
        where = SOURCES.get(source, "default") if source is not None else "default"
        detail = {
            "flag": f"--{setting.key}",
            "environment": setting.variable,
            "profile": getattr(chosen, "source", "profile"),
            "default": "built in",
        }[where]
        rows.append({"setting": setting.key, "value": sub.params.get(name), "source": where,
                     "from": detail})  # fmt: skip
    return rows


def show(ctx: Context, console: Console, command_name: str, args: list[str], as_json: bool) -> None:
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
