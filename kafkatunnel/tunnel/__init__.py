"""The tunnel: asyncio listeners and forwarders around the sans-I/O protocol layer.

The names below load with their module on first use (PEP 562), not with the package: a
command that needs one light module of it (the control socket, the default limits) starts
without the protocol, kio and the TLS stack."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafkatunnel.tunnel.forwarders import (
        DirectForwarder,
        ExecForwarder,
        Forwarder,
        ForwarderError,
        parse_mapping,
    )
    from kafkatunnel.tunnel.registry import BrokerRegistry, Endpoint
    from kafkatunnel.tunnel.tunnel import PortInUse, SettingError, Tunnel, TunnelConfig, Unreachable

__all__ = [
    "BrokerRegistry",
    "DirectForwarder",
    "Endpoint",
    "ExecForwarder",
    "Forwarder",
    "ForwarderError",
    "PortInUse",
    "SettingError",
    "Tunnel",
    "TunnelConfig",
    "Unreachable",
    "parse_mapping",
]
# Each name's module (as imported above for the type checker)
HOMES = {
    "BrokerRegistry": "registry",
    "DirectForwarder": "forwarders",
    "Endpoint": "registry",
    "ExecForwarder": "forwarders",
    "Forwarder": "forwarders",
    "ForwarderError": "forwarders",
    "PortInUse": "tunnel",
    "SettingError": "tunnel",
    "Tunnel": "tunnel",
    "TunnelConfig": "tunnel",
    "Unreachable": "tunnel",
    "parse_mapping": "forwarders",
}


if not TYPE_CHECKING:  # to the type checker, the imports above: a misspelt name is an error

    def __getattr__(name: str) -> object:
        if name not in HOMES:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{HOMES[name]}"), name)
        globals()[name] = value  # looked up once
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *HOMES})
