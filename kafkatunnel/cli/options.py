"""Options more than one command takes (and so one setting name in profiles and
KAFKATUNNEL_* variables)."""

from __future__ import annotations

from typing import Any

import typer


def context_option() -> Any:
    return typer.Option(None, metavar="CONTEXT", help="--via kubectl: the kubectl context.")


def namespace_option() -> Any:
    return typer.Option(
        None,
        "--namespace",
        "-n",
        metavar="NAMESPACE",
        help="--via kubectl: the namespace of the Kafka pods.",
    )


def kubeconfig_option() -> Any:
    return typer.Option(None, metavar="FILE", help="--via kubectl: the kubeconfig file.")


def port_option() -> Any:
    return typer.Option(None, metavar="PORT", help="The tunnel whose bootstrap port this is.")


def json_option() -> Any:
    return typer.Option(False, "--json", help="Print JSON only.")
