"""One supervised `kubectl port-forward pod/<pod> :<port>`.

kubectl exits on any stream error ("lost connection to pod"), never re-picks a pod, and
idles out after the kubelet's streaming timeout. The supervisor restarts it with capped
exponential backoff and jitter, re-resolving the pod each time (a restarted StatefulSet pod
keeps its name, a Deployment pod does not), closes the connections that went through a dead
forward so clients reconnect, and touches idle forwards so they never time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable

from kafkatunnel.kube.kubectl import Kubectl, KubectlError, explain
from kafkatunnel.pids import die_with_parent

log = logging.getLogger("kafkatunnel.kube")

FORWARDING = re.compile(r"^Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")
LOST = "lost connection to pod"


class PortForward:
    def __init__(
        self,
        kubectl: Kubectl,
        resolve_pod: Callable[[], Awaitable[str]],
        port: int,
        on_down: Callable[[], None],
        *,
        backoff: tuple[float, float] = (1.0, 30.0),
        healthy_after: float = 1.0,
        keepalive: float = 60.0,
    ) -> None:
        self.kubectl = kubectl
        self.resolve_pod = resolve_pod
        self.port = port
        self.on_down = on_down
        self.backoff = backoff
        self.healthy_after = healthy_after
        self.keepalive = keepalive
        self.pod: str | None = None
        self.local_port: int | None = None
        self.state = "starting"
        self.restarts = 0
        self.last_error: str | None = None
        self.process: asyncio.subprocess.Process | None = None
        self.local_port_was_up = False  # this run of kubectl printed "Forwarding from"
        self.ready_since: float | None = None  # monotonic time the current forward came up
        self._ready = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._supervise())

    async def stop(self) -> None:
        self._stopping = True
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_ready(self, timeout: float) -> int:
        """The local port of a working forward; waits up to `timeout` for one.

        The forward can die between the wake-up and the read: then wait again, in the
        same deadline, rather than hand out a port that is gone."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                await asyncio.wait_for(self._ready.wait(), max(left, 0))
            except TimeoutError:
                why = f": {self.last_error}" if self.last_error else ""
                raise TimeoutError(
                    f"kubectl port-forward to pod/{self.pod or '?'} :{self.port} not ready "
                    f"within {timeout:g}s ({self.state}){why}"
                ) from None
            if self.local_port is not None:
                return self.local_port

    def describe(self) -> str:
        where = f" -> 127.0.0.1:{self.local_port}" if self.local_port else ""
        return f"kubectl pod/{self.pod or '?'} :{self.port}{where} ({self.state})"

    async def _supervise(self) -> None:
        failures = 0
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._run_once()
            except KubectlError as error:
                self.last_error = str(error)
                log.error("%s", error)
            except OSError as error:
                self.last_error = f"cannot run kubectl: {error}"
            if self._stopping:
                return
            self._down()
            healthy = self.local_port_was_up and time.monotonic() - started >= self.healthy_after
            failures = 0 if healthy else failures + 1
            low, high = self.backoff
            delay = min(high, low * 2 ** max(failures - 1, 0)) * random.uniform(0.5, 1.0)
            self.state = f"restarting in {delay:.1f}s"
            self.restarts += 1
            await asyncio.sleep(delay)

    async def _run_once(self) -> None:
        self.local_port_was_up = False
        self.pod = await self.resolve_pod()
        args = ("port-forward", f"pod/{self.pod}", f":{self.port}")
        self.state = "starting"
        self.process = await asyncio.create_subprocess_exec(
            *self.kubectl.argv(*args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=die_with_parent,  # a killed tunnel leaves no port-forward behind
        )
        errors: list[str] = []
        keepalive = asyncio.get_running_loop().create_task(self._keep_alive())
        try:
            await asyncio.gather(self._read_stdout(), self._read_stderr(errors))
            await self.process.wait()
        finally:
            keepalive.cancel()
        if self._stopping:
            return
        if errors and not self.local_port_was_up:
            raise explain("\n".join(errors), args)
        self.last_error = errors[-1] if errors else f"kubectl exited with {self.process.returncode}"

    async def _read_stdout(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        async for raw in self.process.stdout:
            match = FORWARDING.match(raw.decode(errors="replace"))
            if match and not self._ready.is_set():
                self.local_port = int(match.group(1))
                self.local_port_was_up = True
                self.ready_since = time.monotonic()
                self.state = "ready"
                self.last_error = None
                self._ready.set()

    async def _read_stderr(self, errors: list[str]) -> None:
        assert self.process is not None and self.process.stderr is not None
        async for raw in self.process.stderr:
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            errors.append(line)
            if LOST in line and self.process.returncode is None:
                # kubectl exits by itself after this; make sure it does, and promptly.
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()

    def _down(self) -> None:
        was_ready = self._ready.is_set()
        self._ready.clear()
        self.local_port = None
        self.ready_since = None
        self.state = "down"
        if was_ready:
            self.on_down()

    async def _keep_alive(self) -> None:
        """Open and close a connection through an idle forward now and then: the kubelet
        closes port-forward streams that carry nothing for its streaming idle timeout."""
        while True:
            await asyncio.sleep(self.keepalive)
            if self.local_port is None:
                continue
            with contextlib.suppress(OSError):
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.local_port), 5
                )
                writer.close()
