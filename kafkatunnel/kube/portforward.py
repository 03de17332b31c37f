"""One supervised `kubectl port-forward pod/<pod> :<port>`.

kubectl exits on some stream errors ("lost connection to pod"), never re-picks a pod, and
idles out after the kubelet's streaming timeout. The supervisor restarts it (the first time
at once, then with capped exponential backoff and jitter), re-resolving the pod each time (a
restarted StatefulSet pod keeps its name, a Deployment pod does not), and closes the
connections that went through a dead forward so clients reconnect.

Worse are forwards that stay alive and stop working. After the pod behind it restarted,
kubectl keeps listening while every connection logs "error creating error stream for port
A -> B: Timeout occured" and fails after 30 s (kubernetes/kubectl#686; the same line after
many interrupted connections, kubernetes/kubernetes#78446); kubectl has spelt it "occured"
and "occurred", and logs it structured from 1.37 on. After the pod is gone, a connection logs
"an error occurred forwarding A -> B: ... No such container" (kubernetes/kubernetes#67059):
kubectl up to 1.22 then goes on closing every connection so; since 1.23
(kubernetes/kubernetes#103526) it ends with "lost connection to pod". Such a line, a
periodic check while idle, or a wake from sleep, makes the supervisor ask the broker for
ApiVersions through the forward; no answer within PROBE_TIMEOUT and it is replaced.
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

log = logging.getLogger("kafkatunnel.kube")

FORWARDING = re.compile(r"^Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")
LOST = "lost connection to pod"
# kubectl's lines for connections that a living forward failed: both spellings, and the
# structured form client-go logs them in since kubernetes#129331 (merged in 2026, for
# kubectl 1.37): "Error creating error stream" err="Timeout occurred" localPort=A ...
TROUBLE = re.compile(
    r"error creating (?:error|forwarding) stream for port \S+ -> \S+: Timeout occurr?ed"
    r"|an error occurr?ed forwarding \S+ -> \S+"
    r'|"Error creating (?:error|forwarding) stream"'
    r'|"An error occurred forwarding"'
)
PROBE_TIMEOUT = 5.0  # seconds for the broker to answer ApiVersions through the forward
# A probe of 127.0.0.1:PORT within SECONDS: None when what is behind it answered, else
# "closed" (it hung up first) or what went wrong.
Probe = Callable[[int, float], Awaitable[str | None]]


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
        probe: Probe | None = None,
        starting: Callable[[], bool] = lambda: False,
    ) -> None:
        self.kubectl = kubectl
        self.resolve_pod = resolve_pod
        self.port = port
        self.on_down = on_down
        self.backoff = backoff
        self.healthy_after = healthy_after
        self.keepalive = keepalive
        self.probe = probe or probe_through  # asks what is behind the forward for an answer
        self.starting = starting  # whether its pod is known to be starting (pod_follow.py)
        self.pod: str | None = None
        self.local_port: int | None = None
        self.state = "starting"
        self.restarts = 0
        self.last_error: str | None = None
        self.process: asyncio.subprocess.Process | None = None
        self.local_port_was_up = False  # this run of kubectl printed "Forwarding from"
        self.ready_since: float | None = None  # monotonic time the current forward came up
        self.replacements = 0  # alive but useless forwards replaced
        self.last_replacement: str | None = None  # why the last one was
        self.drops = 0  # forwards that worked and then ended by themselves
        self.last_drop: str | None = None  # what the last one's kubectl said as it ended
        self._replaced_because: str | None = None
        self._probing: asyncio.Task[None] | None = None
        self._trouble = 0  # TROUBLE lines seen from the current kubectl
        self._troubled = asyncio.Event()  # set by each of them
        self._ready = asyncio.Event()
        self._refused = asyncio.Event()  # the last start was refused for good (RBAC)
        self._stopping = False
        self._woken = asyncio.Event()  # ends a pause between tries: the pod is Ready now
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._supervise())

    async def stop(self) -> None:
        self._stopping = True
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        for task in (self._task, self._probing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def wait_ready(self, timeout: float) -> int:
        """The local port of a working forward; waits up to `timeout` for one.

        The forward can die between the wake-up and the read: then wait again, in the
        same deadline, rather than hand out a port that is gone. A start that RBAC refused
        raises its KubectlError at once: waiting would not change the answer."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if self._refused.is_set():
                raise KubectlError(self.last_error or "kubectl was refused", permanent=True)
            left = deadline - asyncio.get_running_loop().time()
            ready = asyncio.ensure_future(self._ready.wait())
            refused = asyncio.ensure_future(self._refused.wait())
            try:
                await asyncio.wait((ready, refused), timeout=max(left, 0),
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            finally:
                ready.cancel()
                refused.cancel()
            if self._refused.is_set():
                continue
            if not self._ready.is_set():
                why = f": {self.last_error}" if self.last_error else ""
                raise TimeoutError(
                    f"kubectl port-forward to pod/{self.pod or '?'} :{self.port} not ready "
                    f"within {timeout:g}s ({self.state}){why}"
                )
            if self.local_port is not None:
                return self.local_port

    def describe(self) -> str:
        where = f" -> 127.0.0.1:{self.local_port}" if self.local_port else ""
        text = f"kubectl pod/{self.pod or '?'} :{self.port}{where} ({self.state})"
        if self.replacements:
            text += f" [{self.replacements} replaced; last: {self.last_replacement}]"
        if self.drops:
            text += f" [{self.drops} dropped; last: {self.last_drop}]"
        return text

    async def _supervise(self) -> None:
        failures = 0
        while not self._stopping:
            started = time.monotonic()
            pending = False
            try:
                await self._run_once()
            except KubectlError as error:
                pending = error.pending
                if error.permanent:
                    self._refused.set()
                if not pending or self.last_error != str(error):  # once per pod state
                    log.log(logging.WARNING if pending else logging.ERROR, "%s", error)
                self.last_error = str(error)
            except OSError as error:
                self.last_error = f"cannot run kubectl: {error}"
            if self._stopping:
                return
            if self.local_port_was_up and self._replaced_because is None:
                self.drops += 1  # kept past its restart: the table says why it went
                self.last_drop = self.last_error
            self._down()
            healthy = self.local_port_was_up and time.monotonic() - started >= self.healthy_after
            failures = 0 if healthy else failures + 1
            if pending:  # a pod coming up is looked at every `low` seconds until it is up
                failures = 1
            low, high = self.backoff
            if self.starting():  # its JVM is on its way: a second at most, not 30
                high = low
            # after a forward that worked, at once; backoff from the second try
            delay = 0.0 if failures == 0 else min(high, low * 2 ** (failures - 1))
            delay *= random.uniform(0.5, 1.0)
            self.state = f"restarting in {delay:.1f}s"
            self.restarts += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), delay)

    async def _run_once(self) -> None:
        self._woken.clear()  # a wake from now on ends the pause after this try
        self.local_port_was_up = False
        self._replaced_because = None
        self._trouble = 0
        self.pod = await self.resolve_pod()
        args = ("port-forward", f"pod/{self.pod}", f":{self.port}")
        self.state = "starting"
        self.process = await self.kubectl.start(*args)  # dies with the tunnel
        errors: list[str] = []
        keepalive = asyncio.get_running_loop().create_task(self._keep_alive())
        try:
            await asyncio.gather(self._read_stdout(), self._read_stderr(errors))
            await self.process.wait()
        finally:
            keepalive.cancel()
        if self._stopping:
            return
        if self._replaced_because is not None:
            self.last_error = f"replaced: {self._replaced_because}"
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
                self._refused.clear()
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
            elif TROUBLE.search(line):
                self._trouble += 1
                self._troubled.set()
                self.check(f"kubectl said: {line}")

    def _down(self) -> None:
        was_ready = self._ready.is_set()
        self._ready.clear()
        self.local_port = None
        self.ready_since = None
        self.state = "down"
        if was_ready:
            self.on_down()

    async def _keep_alive(self) -> None:
        """Check an idle forward now and then: it keeps the kubelet's streaming idle timeout
        from closing it, and finds a forward that stopped working before a client does."""
        while True:
            await asyncio.sleep(self.keepalive)
            if self.local_port is not None:
                self.check("periodic check")

    def wake(self, why: str) -> None:
        """Try now rather than at the end of the pause: the pod is Ready."""
        if self.local_port is None and not self._stopping:
            log.debug("port-forward to pod/%s :%d: trying now, %s", self.pod, self.port, why)
            self._woken.set()

    def replace(self, why: str) -> None:
        """End the running kubectl (it reaches a pod that is gone); the supervisor starts
        another at once."""
        process = self.process
        if process is None or process.returncode is not None or self._stopping:
            return
        if self._replaced_because is not None:
            return
        log.info("port-forward to pod/%s :%d: replacing it, %s", self.pod, self.port, why)
        self._replaced_because = self.last_replacement = why
        self.replacements += 1
        with contextlib.suppress(ProcessLookupError):
            process.kill()

    def check(self, signal: str) -> None:
        """Probe the forward (once at a time); replace it if the broker does not answer."""
        if self._probing is not None and not self._probing.done():
            return
        if self._replaced_because is not None:
            return  # being replaced already: its kubectl is not reaped yet
        if self.local_port is None or self.process is None or self.process.returncode is not None:
            return
        log.debug("checking the port-forward to pod/%s :%d: %s", self.pod, self.port, signal)
        self._probing = asyncio.get_running_loop().create_task(self._probe(signal))
        self._probing.add_done_callback(self._probed)

    def _probed(self, task: asyncio.Task[None]) -> None:
        """A check that failed in itself is said in one line; no task ends unobserved."""
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("checking the port-forward to pod/%s :%d failed: %s: %s",
                        self.pod, self.port, type(error).__name__, error)  # fmt: skip

    async def _probe(self, signal: str) -> None:
        port, process, trouble = self.local_port, self.process, self._trouble
        assert port is not None and process is not None
        self._troubled.clear()
        failure = await self.probe(port, PROBE_TIMEOUT)
        if failure == "closed" and self._trouble == trouble:
            # kubectl logs a failed connection as it closes it; a broker that only speaks
            # TLS hangs up on plaintext without a word from kubectl
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._troubled.wait(), 1.0)
            if self._trouble == trouble:
                failure = None
        if failure is None or process is not self.process or process.returncode is not None:
            return
        log.warning("port-forward to pod/%s :%d stopped working (%s; %s): replacing it",
                    self.pod, self.port, failure, signal)  # fmt: skip
        if self._replaced_because is None:
            self._replaced_because = self.last_replacement = f"{failure} after {signal}"
            self.replacements += 1
            with contextlib.suppress(ProcessLookupError):
                process.kill()


async def probe_through(port: int, timeout: float) -> str | None:
    """ApiVersions to 127.0.0.1:port: None when anything answers within `timeout`, else
    "closed" (the far end hung up first) or what went wrong."""
    from kafkatunnel.probe import api_versions_request

    return await _ask(port, api_versions_request(), timeout, "ApiVersions")


async def probe_http(port: int, timeout: float) -> str | None:
    """An HTTP request to 127.0.0.1:port: None when any answer starts within `timeout`
    (a 404 is an answer: the server behind the forward is alive)."""
    return await _ask(port, b"HEAD / HTTP/1.0\r\n\r\n", timeout, "an HTTP request")


async def probe_tcp(port: int, timeout: float) -> str | None:
    """A TCP connection through the forward that the far end keeps (a service whose
    protocol is unknown: nothing is sent). kubectl accepts every local connection; the pod's
    port refusing it shows as the forward hanging up at once, with kubectl's error line."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    except (OSError, TimeoutError) as error:
        return f"cannot connect to the forward: {error or 'timed out'}"
    try:
        data = await asyncio.wait_for(reader.read(1), min(timeout, 1.0))
        return None if data else "closed"
    except TimeoutError:
        return None  # kept open: the pod's port took the connection
    except (OSError, RuntimeError) as error:  # RuntimeError: uvloop's closed transport
        return f"connection failed: {error}"
    finally:
        writer.close()


async def _ask(port: int, request: bytes, timeout: float, what: str) -> str | None:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    except (OSError, TimeoutError) as error:
        return f"cannot connect to the forward: {error or 'timed out'}"
    return await exchange(reader, writer, request, timeout, what)


async def exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    request: bytes,
    timeout: float,
    what: str,
) -> str | None:
    """`request` sent on an open probe connection: None when an answer starts within
    `timeout`, else why not. The connection can close under the probe before it writes
    (kubectl hangs up on a pod port that refuses); uvloop then raises RuntimeError from
    write, asyncio's own loop drops the bytes: either way the probe failed, it did not
    break."""
    try:
        if writer.transport.is_closing():
            return "closed"
        writer.write(request)
        data = await asyncio.wait_for(reader.read(4), timeout)
        return None if data else "closed"
    except TimeoutError:
        return f"no answer to {what} within {timeout:g}s"
    except RuntimeError:  # uvloop's transport, closed under the write
        return "closed"
    except OSError as error:
        return f"connection failed: {error}"
    finally:
        writer.close()
