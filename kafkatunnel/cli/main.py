"""The `kafkatunnel` command: the command modules of this package assembled into one typer
app, with KAFKATUNNEL_* variables for every setting, output that fits where it goes, and
one clear message, never a traceback, for whatever a user can get wrong."""

from __future__ import annotations

import sys
import traceback
import types
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from kafkatunnel.cli import (
    background,
    config,
    coordinator,
    demo,
    dns,
    doctor,
    env,
    run,
    tunnel,
    verify,
)
from kafkatunnel.cli.helptext import prepare_help
from kafkatunnel.cli.output import (
    UNBOUNDED,
    configure_logging,
    debugging,
    error,
    fits_terminal,
)
from kafkatunnel.cli.settings import add_environment_variables, apply

app = typer.Typer(
    help="Reach a Kafka cluster inside Kubernetes from your laptop, every broker and every "
    "consumer group included.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def main_options(
    ctx: typer.Context,
    config_file: Path | None = typer.Option(
        None,
        "--config",
        envvar="KAFKATUNNEL_CONFIG",
        metavar="FILE",
        help="Settings file (default: ./kafkatunnel.toml when present).",
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        envvar="KAFKATUNNEL_PROFILE",
        metavar="NAME",
        help="A profile of the settings file.",
    ),
    verbose: int = typer.Option(
        0, "--verbose", "-v", count=True, help="More log (-vv: debug, tracebacks)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Errors only."),
) -> None:
    """Reach a Kafka cluster inside Kubernetes from your laptop, every broker and every
    consumer group included. Settings: flags > KAFKATUNNEL_* > kafkatunnel.toml profile."""
    configure_logging(verbose, quiet)
    apply(ctx, config_file, profile)


app.command()(coordinator.coordinator)
app.command()(tunnel.up)
app.command()(tunnel.status)
app.command()(background.down)
# `run`'s arguments are `up`'s options and then the command: it reads them itself
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run.run)
app.command()(env.env)
app.add_typer(dns.app, name="dns")
app.command()(verify.verify)
app.command()(doctor.doctor)
app.add_typer(config.app, name="config")
app.command()(demo.demo)


def command() -> TyperGroup:
    """The click command behind the app, ready to run: environment variables added, flags
    shown as flags, and help that lists everything whole (cli/helptext.py)."""
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    add_environment_variables(group)
    plain = not fits_terminal(sys.stdout)
    if plain:  # click wraps and shortens help to fit its width: give it one nothing reaches
        group.context_settings.update(terminal_width=UNBOUNDED, max_content_width=UNBOUNDED)
    for each in _walk(group):
        prepare_help(each, plain)
        help_option = each.get_help_option(typer.Context(each, **each.context_settings))
        for param in [*each.params, *([help_option] if help_option else [])]:
            if getattr(param, "is_flag", False) or getattr(param, "count", False):
                param.metavar = ""  # a flag takes no value: show none (Rich: `<bool>`)
            elif isinstance(param, TyperOption):
                _refuse_empty(param)
    return group


def _refuse_empty(option: TyperOption) -> None:
    """An option's value is never empty: `--exec ""` would read as no --exec at all, and
    `--record ""` as the current directory. Checked before the value is converted (a path
    of "" is already "." after)."""
    process = option.process_value

    def process_value(self: TyperOption, ctx: typer.Context, value: Any) -> Any:
        values = value if isinstance(value, list | tuple) else [value]
        if any(isinstance(each, str) and not each.strip() for each in values):
            raise typer.BadParameter(f"empty: give {self.metavar or 'a value'}", ctx, self)
        return process(ctx, value)

    option.process_value = types.MethodType(process_value, option)  # type: ignore[method-assign]


def _walk(command: TyperCommand | TyperGroup) -> list[TyperCommand | TyperGroup]:
    found = [command]
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            assert isinstance(sub, TyperCommand | TyperGroup)
            found.extend(_walk(sub))
    return found


def main() -> None:
    """The console script. Anything that escapes the commands' own error handling is still
    one message and exit status 70 (-vv adds the traceback, for a bug report)."""
    try:
        command().main(prog_name="kafkatunnel")
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as cause:
        if debugging():
            traceback.print_exc()
        error(f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__,
              "this is a kafkatunnel bug: please report it with the output of the same "
              "command run with -vv")  # fmt: skip
        raise SystemExit(70) from None
