"""A tunnel on its own event loop thread, for synchronous callers (the demo, benchmarks,
tests) that drive blocking Kafka clients beside it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

from kafkatunnel.tunnel.forwarders import Forwarder
from kafkatunnel.tunnel.tunnel import Tunnel, TunnelConfig

T = TypeVar("T")


class BackgroundTunnel:
    def __init__(self, config: TunnelConfig, forwarder: Forwarder, *, uvloop: bool = False) -> None:
        self.tunnel = Tunnel(config, forwarder)
        if uvloop:  # what `kafkatunnel up` runs on when it is installed
            import uvloop as libuv

            self.loop: asyncio.AbstractEventLoop = libuv.new_event_loop()
        else:
            self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tunnel", daemon=True)

    def call(self, coroutine: Awaitable[T], timeout: float = 30.0) -> T:
        """Run a coroutine on the tunnel's loop and wait for its result."""

        async def wrapped() -> T:
            return await coroutine

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(timeout)

    def status(self) -> dict[str, Any]:
        async def snapshot() -> dict[str, Any]:
            return self.tunnel.status()

        return self.call(snapshot())

    def metrics(self) -> str:
        async def snapshot() -> str:
            return self.tunnel.metrics()

        return self.call(snapshot())

    @property
    def bootstrap_servers(self) -> str:
        return self.tunnel.bootstrap_servers

    def start(self) -> BackgroundTunnel:
        self._thread.start()
        try:
            self.call(self.tunnel.start())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            try:
                self.call(self.tunnel.stop(), timeout=15)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(10)
        self.loop.close()

    def __enter__(self) -> BackgroundTunnel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
