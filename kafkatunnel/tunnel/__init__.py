"""The tunnel: asyncio listeners and forwarders around the sans-I/O protocol layer."""

from kafkatunnel.tunnel.forwarders import (
    DirectForwarder,
    ExecForwarder,
    Forwarder,
    ForwarderError,
    parse_mapping,
)
from kafkatunnel.tunnel.registry import BrokerRegistry, Endpoint
from kafkatunnel.tunnel.tunnel import PortInUse, Tunnel, TunnelConfig, Unreachable

__all__ = [
    "BrokerRegistry",
    "DirectForwarder",
    "Endpoint",
    "ExecForwarder",
    "Forwarder",
    "ForwarderError",
    "PortInUse",
    "Tunnel",
    "TunnelConfig",
    "Unreachable",
    "parse_mapping",
]
