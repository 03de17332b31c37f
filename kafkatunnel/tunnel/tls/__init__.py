"""TLS in the tunnel: to the brokers (`up --tls`: the tunnel is every broker's TLS client, so
it still sees the Kafka frames it rewrites) and to the clients (`up --client-tls`, with a
CA of the tunnel's own).

- options: the flags, and the one SSLContext made of them
- handshake: TLS over whatever stream a forwarder opened, and the upstream it leaves
- streams: TLS as a byte stream the relay reads and writes as plaintext
- forwarder: any forwarder, with TLS over each stream it opens
- local_ca: the tunnel's own CA and listener certificate for --client-tls
- messages: what went wrong, in words a user can act on; a session's facts for status
"""

from kafkatunnel.tunnel.tls.forwarder import TlsForwarder, shown_certificate, speaks_tls
from kafkatunnel.tunnel.tls.handshake import TlsUpstream, accept_tls, start_tls
from kafkatunnel.tunnel.tls.local_ca import CA_USAGE, ClientTls, listener_tls
from kafkatunnel.tunnel.tls.options import (
    TlsOptions,
    TlsSetupError,
    client_context,
    load_pem_chain,
    pkcs12_pem,
)

__all__ = [
    "CA_USAGE",
    "ClientTls",
    "TlsForwarder",
    "TlsOptions",
    "TlsSetupError",
    "TlsUpstream",
    "accept_tls",
    "client_context",
    "listener_tls",
    "load_pem_chain",
    "pkcs12_pem",
    "shown_certificate",
    "speaks_tls",
    "start_tls",
]
