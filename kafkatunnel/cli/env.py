"""`kafkatunnel env`: a running tunnel's client settings for any shell, IDE or client
(`eval "$(kafkatunnel env)"`, a run configuration's .env file, a GUI client's properties),
the same settings `kafkatunnel run` hands its command (kafkatunnel/client_settings.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import typer

from kafkatunnel.cli.background import running_or_exit
from kafkatunnel.cli.options import port_option
from kafkatunnel.cli.output import error, make_console
from kafkatunnel.client_settings import (
    FORMATS,
    JAVA_FILE_VARIABLE,
    LIBRDKAFKA_FILE_VARIABLE,
    ClientSetting,
    SettingsError,
    client_settings,
    render,
)
from kafkatunnel.files import state_dir, state_directory, write_whole
from kafkatunnel.tunnel.control import fetch


def env(
    fmt: str = typer.Option(
        "sh",
        "--format",
        metavar="|".join(FORMATS),
        help="sh, fish or powershell (for eval), dotenv (an IDE's .env), json; properties "
        "(Kafka's Java clients and tools) or librdkafka (kcat -F): the client's own settings.",
    ),
    port: int | None = port_option(),
) -> None:
    """Print the running tunnel's client settings: bootstrap.servers as KAFKA_* and
    SPRING_KAFKA_* variables, and the files for Java tools and kcat."""
    if fmt not in FORMATS:
        raise typer.BadParameter(f"{fmt!r} is not one of {', '.join(FORMATS)}",
                                 param_hint="--format")  # fmt: skip
    tunnels = running_or_exit(make_console(stderr=True), port)
    if len(tunnels) > 1:
        ports = ", ".join(str(p) for p in sorted(tunnels))
        error(f"{len(tunnels)} tunnels run (ports {ports})", "choose one with --port PORT")
        raise typer.Exit(2)
    [(tunnel_port, state)] = tunnels.items()
    status = json.loads(fetch(state["control"], "/status"))
    try:
        settings = client_settings(status)
        text = render(fmt, settings, settings_files(state_dir(), f"tunnel-{tunnel_port}", settings))
    except SettingsError as cause:
        error(str(cause), "start the tunnel with a state directory whose path is one line")
        raise typer.Exit(2) from None
    typer.echo(text, nl=False)


def settings_files(
    directory: Path, stem: str, settings: Mapping[ClientSetting, str]
) -> dict[str, Path]:
    """The settings as a Java client.properties and a librdkafka file in `directory` (only
    their owner may read them), by the variable that names each."""
    state_directory(directory)
    java = directory / f"{stem}-client.properties"
    librdkafka = directory / f"{stem}-librdkafka.conf"
    write_whole(java, render("properties", settings, {}).encode())
    write_whole(librdkafka, render("librdkafka", settings, {}).encode())
    return {JAVA_FILE_VARIABLE: java, LIBRDKAFKA_FILE_VARIABLE: librdkafka}
