"""The DNS shim: each broker's in-cluster names resolve to its own loopback address."""

from kafkatunnel.dns.answer import answer
from kafkatunnel.dns.names import Zone
from kafkatunnel.dns.server import DnsServer

__all__ = ["DnsServer", "Zone", "answer"]
