"""Where the settings of `up` and `doctor` come from: kafkatunnel.toml profiles and
KAFKATUNNEL_* variables (see kafkatunnel.cli.profiles) below the flags. Each long option of
those commands is a setting of the same name."""

from __future__ import annotations

import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import typer
from typer.core import TyperGroup as Group

from kafkatunnel.cli.output import error, warning
from kafkatunnel.cli.profiles import ConfigError, Setting, check_environment, load_profile

CONFIGURABLE = ("up", "doctor")


class Parameter(Protocol):
    """What is read of a command's parameter (typer's click parameters, by their shape:
    typer keeps click's classes private)."""

    @property
    def opts(self) -> list[str]: ...
    @property
    def name(self) -> str | None: ...


class Command(Protocol):
    @property
    def params(self) -> Sequence[Parameter]: ...


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
        chosen = load_profile(settings, config, profile, warn=warning)
    except ConfigError as cause:
        error(str(cause))
        raise typer.Exit(2) from None
    defaults: dict[str, Any] = {}
    for name in CONFIGURABLE:
        if name in group.commands:
            own = settings_of(group.commands[name])
            defaults[name] = {k: v for k, v in chosen.values.items() if k in own}
    ctx.default_map = defaults
    ctx.obj = chosen
