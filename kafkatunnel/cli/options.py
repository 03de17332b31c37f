"""Options more than one command takes (and so one setting name in profiles and
KAFKATUNNEL_* variables)."""

from __future__ import annotations

from typing import Any

import typer


def context_option(panel: str | None = None) -> Any:
    return typer.Option(
        None, metavar="CONTEXT", help="--via kubectl: the kubectl context.", rich_help_panel=panel
    )


def namespace_option(panel: str | None = None) -> Any:
    return typer.Option(
        None,
        "--namespace",
        "-n",
        metavar="NAMESPACE",
        help="--via kubectl: the namespace of the Kafka pods.",
        rich_help_panel=panel,
    )


def kubeconfig_option(panel: str | None = None) -> Any:
    return typer.Option(
        None, metavar="FILE", help="--via kubectl: the kubeconfig file.", rich_help_panel=panel
    )


def target_option(panel: str | None = None) -> Any:
    return typer.Option(
        None,
        metavar="KIND/NAME",
        help="--via kubectl: statefulset/NAME or svc/NAME whose pods are the brokers.",
        rich_help_panel=panel,
    )


def selector_option(panel: str | None = None) -> Any:
    return typer.Option(
        None,
        "--selector",
        "-l",
        metavar="LABELS",
        help="--via kubectl: a label selector for the broker pods.",
        rich_help_panel=panel,
    )


def kafka_port_option(panel: str | None = None) -> Any:
    return typer.Option(
        None,
        min=1,
        max=65535,
        metavar="PORT",
        help="--via kubectl without --bootstrap: the port (default 9092; with --tls, the pods' "
        "TLS port as Strimzi names it, tcp-clientstls).",
        rich_help_panel=panel,
    )


def port_option() -> Any:
    return typer.Option(
        None, min=1, max=65535, metavar="PORT", help="The tunnel whose bootstrap port this is."
    )


def json_option() -> Any:
    return typer.Option(False, "--json", help="Print JSON only.")
