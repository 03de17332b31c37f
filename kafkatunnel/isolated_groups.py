"""`kafkatunnel down --clean`: the groups an isolating tunnel's clients used, deleted.

They are deleted through the tunnel itself, by the names the clients used: the tunnel
isolates each on its way (`orders` -> `orders.kt-alice`), so only the laptop's own groups
can be deleted, never the deployed group of the same name, whatever the list holds. The
list is what the tunnel saw clients name; a name only described (not used) is simply not
found. The cluster keeps an isolated group's offsets until its offsets retention otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kafkatunnel.client_settings import client_settings, librdkafka_properties
from kafkatunnel.protocol import one_line

TIMEOUT = 30.0  # seconds for the whole deletion


class CleanError(Exception):
    """The groups cannot be deleted by this command; the message says what to do."""


@dataclass
class Cleaned:
    """What --clean did, by the client's name of each group (the cluster's is NAME.SUFFIX)."""

    suffix: str
    deleted: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)  # never made, or deleted before
    failed: dict[str, str] = field(default_factory=dict)  # name -> why, with what to do


def isolated_groups(status: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    """The suffix and the groups of an isolating tunnel's status; None: it does not isolate."""
    isolation = status.get("isolation")
    if not isinstance(isolation, Mapping):
        return None
    groups = [g for g in isolation.get("groups", ()) if isinstance(g, str) and g]
    return str(isolation["suffix"]), groups


def delete_isolated_groups(status: Mapping[str, Any], timeout: float = TIMEOUT) -> Cleaned:
    """Delete, through the tunnel whose status this is, the isolated groups its clients
    used. CleanError when the tunnel does not isolate, or when the cluster wants a login
    only the clients make (this command has no credentials of theirs)."""
    found = isolated_groups(status)
    if found is None:
        raise CleanError("this tunnel does not isolate (kafkatunnel up --isolate): "
                         "it made no groups of its own")  # fmt: skip
    suffix, groups = found
    cleaned = Cleaned(suffix)
    if not groups:
        return cleaned
    login = status.get("client_login")
    if login:
        raise CleanError(
            f"the cluster wants its clients to log in ({login['security_protocol']}), and "
            "the tunnel does not log in for them: delete the groups with a client of yours "
            "through the tunnel, by the names it used (kafka-consumer-groups "
            f"--bootstrap-server {status['bootstrap_servers']} --delete --group NAME), or "
            "start the tunnel with --sasl-mechanism so that it logs in"
        )
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    settings = librdkafka_properties(client_settings(status))
    admin = AdminClient({**settings, "socket.timeout.ms": int(timeout * 1000)})
    futures = admin.delete_consumer_groups(groups, request_timeout=timeout)
    for name in groups:
        try:
            futures[name].result(timeout)
        except TimeoutError:
            cleaned.failed[name] = f"no answer within {timeout:g}s: is the tunnel serving?"
        except KafkaException as raised:
            error = raised.args[0]
            if not isinstance(error, KafkaError):
                cleaned.failed[name] = one_line(error)
            elif error.code() == KafkaError.GROUP_ID_NOT_FOUND:
                cleaned.absent.append(name)
            elif error.code() == KafkaError.NON_EMPTY_GROUP:
                cleaned.failed[name] = ("it still has members: stop the local application, "
                                        "then run this again")  # fmt: skip
            else:
                cleaned.failed[name] = one_line(error.str())
        else:
            cleaned.deleted.append(name)
    return cleaned
