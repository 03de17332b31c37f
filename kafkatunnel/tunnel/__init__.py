"""The tunnel: asyncio listeners and forwarders around the sans-I/O protocol layer."""

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
