"""Asking the deployed groups what an isolated client's OffsetFetch asks (`up --isolate
--isolate-from-deployed`, see protocol/deployed_offsets.py): each group's coordinator is
found and asked through the forwarder, as the tunnel itself (its TLS and login, when it
makes them), the groups side by side. A group that cannot be asked is said once; its
isolated group then starts as its client's auto.offset.reset says."""

from __future__ import annotations

import asyncio
import logging

from kafkatunnel.probe import ErrorAnswer
from kafkatunnel.protocol import DeployedAsk, ProtocolError, one_line
from kafkatunnel.tunnel.discovery import answer_of, group_coordinator
from kafkatunnel.tunnel.forwarders import Forwarder, ForwarderError
from kafkatunnel.tunnel.registry import BrokerRegistry, Endpoint

log = logging.getLogger("kafkatunnel.tunnel")
SAID = 1000  # groups whose failure was said; past this many, they are not


class DeployedOffsets:
    """The tunnel's asker of deployed groups' offsets."""

    def __init__(
        self, forwarder: Forwarder, bootstrap: Endpoint, registry: BrokerRegistry, timeout: float
    ) -> None:
        self.forwarder = forwarder
        self.bootstrap = bootstrap
        self.registry = registry
        self.timeout = timeout
        self._said: set[str] = set()

    async def answers(self, ask: DeployedAsk) -> dict[str, bytes | None]:
        """Each group's coordinator's answer to its request (None: none had)."""
        got = await asyncio.gather(*(self._one(g, r) for g, r in ask.requests.items()))
        return dict(zip(ask.requests, got, strict=True))

    async def _one(self, group: str, request: bytes) -> bytes | None:
        host, port = self.bootstrap.advertised_host, self.bootstrap.advertised_port
        try:
            found = await group_coordinator(self.forwarder, host, port, group, self.timeout)
            self.registry.learn([found])  # its name checked before anything reaches it
            coordinator = self.registry.brokers.get(found.node_id)
            if coordinator is None:
                raise ConnectionError(f"its coordinator (node {found.node_id}) is not served")
            return await answer_of(self.forwarder, coordinator.advertised_host,
                                   coordinator.advertised_port, request, self.timeout)  # fmt: skip
        except (OSError, TimeoutError, ForwarderError, ProtocolError, ErrorAnswer) as error:
            self.unread(group, str(error) or type(error).__name__)
            return None

    def unread(self, group: str, why: str) -> None:
        """Say, once per group, that its deployed offsets could not be had."""
        if group in self._said or len(self._said) >= SAID:
            return
        self._said.add(group)
        log.warning("could not read the deployed group %r's committed offsets (%s): its "
                    "isolated group starts where the client's auto.offset.reset says",
                    one_line(group, 120), one_line(why))  # fmt: skip
