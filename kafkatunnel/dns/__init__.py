"""The DNS shim: each broker's in-cluster names resolve to its own loopback address."""

from kafkatunnel.dns.answer import answer
from kafkatunnel.dns.names import BrokerName, Zone, broker_name
from kafkatunnel.dns.server import DnsServer

__all__ = ["BrokerName", "DnsServer", "Zone", "answer", "broker_name"]
