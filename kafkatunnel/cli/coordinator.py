"""`kafkatunnel coordinator`: which partition, and which broker, coordinates a group or a
transactional id. The first thing troubleshooting asks for, so every answer is a sentence
and every failure names its cause."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from kafkatunnel.cli.options import json_option
from kafkatunnel.cli.output import error, make_console
from kafkatunnel.hostnames import split_address

if TYPE_CHECKING:
    from kafkatunnel.probe import Coordinator

# Kafka's default partitions of both topics, kafkatunnel.protocol's DEFAULT_PARTITIONS:
# said here too, for --help to show without loading the protocol (a test holds them equal)
PARTITIONS = 50


def coordinator(
    key: str = typer.Argument(
        ...,
        metavar="KEY",
        help="A consumer group id (or, with --transactional, a transactional id).",
    ),
    partitions: int = typer.Option(
        PARTITIONS,
        min=1,
        metavar="N",
        help="Partitions of __consumer_offsets / __transaction_state.",
    ),
    transactional: bool = typer.Option(False, help="KEY is a transactional id."),
    bootstrap: str | None = typer.Option(
        None,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="Ask this cluster (or tunnel) which broker coordinates KEY.",
    ),
    as_json: bool = json_option(),
) -> None:
    """Which partition, and with --bootstrap which broker, coordinates a group."""
    from kafkatunnel.protocol import GROUP_TOPIC, TRANSACTION_TOPIC, partition_for

    kind = "transactional id" if transactional else "group id"
    if not key:
        raise typer.BadParameter(f"an empty {kind}: Kafka clients refuse it; name the {kind}")
    topic = TRANSACTION_TOPIC if transactional else GROUP_TOPIC
    partition = partition_for(key, partitions)
    result: dict[str, object] = {"key": key, "transactional": transactional, "topic": topic,
                                 "partition": partition, "partitions": partitions}  # fmt: skip
    found = None
    if bootstrap is not None:
        found = _ask(bootstrap, key, transactional)
        result.update(
            coordinator={"node_id": found.node_id, "address": found.address},
            error_code=found.error_code,
        )
    if as_json:
        typer.echo(json.dumps(result))
        return
    console = make_console()
    console.print(f"{kind} {key!r} is coordinated by the leader of partition {partition} of "
                  f"{topic} ({partitions} partitions)", highlight=False, markup=False)  # fmt: skip
    if found is None:
        return
    if found.error_code:
        name = _error_name(found.error_code)
        error(f"{bootstrap} answered {name} ({found.error_code}) for {key!r}",
              "the cluster is starting or moving it: ask again in a moment")  # fmt: skip
        raise typer.Exit(1)
    console.print(f"coordinator: broker {found.node_id} at {found.address}", highlight=False)


def _ask(bootstrap: str, key: str, transactional: bool) -> Coordinator:
    from kafkatunnel.probe import ErrorAnswer, find_coordinator
    from kafkatunnel.protocol import ProtocolError

    for address in bootstrap.split(","):
        try:
            split_address(address.strip())
        except ValueError as cause:
            raise typer.BadParameter(
                f"{cause}; expected HOST:PORT, e.g. 127.0.0.1:9092", param_hint="--bootstrap"
            ) from None
    try:
        return find_coordinator(bootstrap, key, transactional=transactional)
    except (OSError, ProtocolError, ErrorAnswer) as cause:
        error(f"cannot ask {bootstrap}: {cause}",
              "check the address; through the tunnel, use the bootstrap.servers `kafkatunnel "
              "up` printed (is it running? `kafkatunnel status`)")  # fmt: skip
        raise typer.Exit(2) from None


def _error_name(code: int) -> str:
    from kio.schema.errors import ErrorCode

    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"error {code}"
