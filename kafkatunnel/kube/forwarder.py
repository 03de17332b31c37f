"""`--via kubectl`: one supervised port-forward per broker, found through the pods.

A laptop that slept leaves every forward's connection to the API server dead while kubectl
keeps running (docker/cli#2436). The clock shows it: CLOCK_BOOTTIME counts the time asleep,
CLOCK_MONOTONIC does not (elsewhere, the wall clock jumps against the monotonic one). When
the gap between them grows, every forward is probed at once and the dead ones replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

from kafkatunnel.kube import strimzi
from kafkatunnel.kube.kubectl import Kubectl, KubectlError, explain
from kafkatunnel.kube.pod_follow import Decision, PodFollower, Replace, Wake
from kafkatunnel.kube.pods import DEFAULT_SELECTORS, Pod, parse_pods, pod_for, selector_of
from kafkatunnel.kube.portforward import PortForward, Probe
from kafkatunnel.kube.watch_stream import WatchStream, WatchStreamError
from kafkatunnel.tunnel.forwarders import (
    DirectForwarder,
    Forwarder,
    ForwarderError,
    Upstream,
)

log = logging.getLogger("kafkatunnel.kube")

WAKE_THRESHOLD = 5.0  # seconds the clocks must drift apart to count as a sleep
POLL_EVERY = 0.5  # seconds between listings of the pods while a broker is down (no watch)


def suspended_time() -> float:
    """Seconds this machine has been asleep so far (or its wall clock stepped)."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
    return time.time() - time.monotonic()


class KubectlForwarder(Forwarder):
    kind = "kubectl"
    follows_pods = True  # watches (or lists) the broker pods it forwards to

    def __init__(
        self,
        kubectl: Kubectl,
        *,
        target: str | None = None,
        selector: str | None = None,
        ready_timeout: float = 5.0,
        backoff: tuple[float, float] = (1.0, 30.0),
        keepalive: float = 60.0,
        sleep_check: float = 1.0,
    ) -> None:
        self.kubectl = kubectl
        self.target = target
        self.selector = selector
        self.ready_timeout = ready_timeout
        self.backoff = backoff
        self.keepalive = keepalive  # seconds between checks of an idle forward
        self.sleep_check = sleep_check  # seconds between looks at the clocks
        self.asleep: Callable[[], float] = suspended_time
        self._sleep_watch: asyncio.Task[None] | None = None
        self.pods: list[Pod] = []
        self.follower = PodFollower(())
        self.following: str | None = None  # how the pods are followed: "watch" or "listing"
        self._follow_task: asyncio.Task[None] | None = None
        self.forwards: dict[tuple[str, int], PortForward] = {}
        self._through: dict[tuple[str, int], set[Upstream]] = {}
        self._tcp = DirectForwarder()

    async def prepare(self) -> None:
        """Check kubectl and the context, and find the Kafka pods: with get and list on pods
        only (the least a forward needs), so a missing namespace shows as one without pods."""
        self.kubectl.check_installed()
        await self.kubectl.current_context()
        if self.selector is None and self.target is not None:
            self.selector = selector_of(await self.kubectl.get_json(self.target))
        self.pods = await self._list()
        if not self.pods and not self.kubectl.namespace and self.target is None:
            namespace = await self._namespace_with_brokers()
            if namespace is not None:
                log.warning(
                    "no Kafka brokers in the current namespace: using namespace %s, "
                    "the one that has them (say so: -n %s)",
                    namespace,
                    namespace,
                )
                self.kubectl = dataclasses.replace(self.kubectl, namespace=namespace)
                self.pods = await self._list()
        self.follower = PodFollower(self.pods)
        if not self.pods:
            where = (f'namespace "{self.kubectl.namespace}"' if self.kubectl.namespace
                     else "the current namespace")  # fmt: skip
            if not parse_pods(await self.kubectl.get_json("pods")):
                raise KubectlError(
                    f"no pods at all in {where}: does it exist? (`kubectl get namespaces` "
                    "lists them, if you may); choose the Kafka namespace with --namespace"
                )
            raise KubectlError(
                f"no Kafka pods found in {where} (tried {self._selectors()}): name them with "
                "--target statefulset/NAME, --target svc/NAME or -l SELECTOR, and --namespace"
            )

    def _selectors(self) -> tuple[str, ...]:
        return (self.selector,) if self.selector else DEFAULT_SELECTORS

    async def _list(self) -> list[Pod]:
        """The broker pods (never ZooKeeper, operator or controller-only pods)."""
        for selector in self._selectors():
            listing = await self.kubectl.get_json("pods", "-l", selector)
            pods = [pod for pod in parse_pods(listing) if pod.is_broker()]
            if pods:
                self.selector = selector
                return pods
        return []

    async def _namespace_with_brokers(self) -> str | None:
        """The one namespace whose pods are Kafka brokers, asking across namespaces (None
        when nobody has them or the user may not list pods cluster-wide); several: say
        which, and ask for --namespace."""
        found: dict[str, list[str]] = {}
        for selector in self._selectors():
            try:
                listing = await self.kubectl.get_json("pods", "--all-namespaces", "-l", selector)
            except KubectlError:
                return None
            for pod in parse_pods(listing):
                if pod.is_broker() and pod.namespace:
                    found.setdefault(pod.namespace, []).append(pod.name)
            if found:
                break
        if len(found) > 1:
            each = "; ".join(
                f"{ns}: {', '.join(sorted(pods))}" for ns, pods in sorted(found.items())
            )
            raise KubectlError(
                f"Kafka brokers run in {len(found)} namespaces ({each}): choose one with "
                "--namespace NAME"
            )
        return next(iter(found), None)

    def default_bootstrap(self, port: int | None, tls: bool = False) -> str:
        """The first pod (by name) on `port`: a bootstrap when no --bootstrap was given.

        With TLS on Strimzi's pods: the port of their TLS listener, and the name the
        broker's certificate carries (`<pod>.<cluster>-kafka-brokers.<namespace>.svc`)."""
        pod = self.pods[0]
        cluster = strimzi.cluster_of(self.pods) if tls else None
        if tls and port is None:
            port = strimzi.tls_port(self.pods)
        if cluster is not None and pod.namespace:
            return f"{strimzi.broker_name(pod, cluster)}:{port or 9093}"
        return f"{pod.name}:{port or 9092}"

    async def _resolve(self, host: str, port: int) -> str:
        pod = pod_for(host, port, self.pods)
        if pod is None or pod.why_unusable():
            self.pods = await self._list()  # a restarted or rescheduled pod
            self._decide(self.follower.listed(self.pods, time.monotonic()))
            pod = pod_for(host, port, self.pods)
        if pod is None:
            names = ", ".join(p.name for p in self.pods) or "none"
            raise KubectlError(
                f"no pod for broker {host}:{port} (pods: {names}); brokers are matched to pods "
                "by their name's first label or by pod IP"
            )
        problem = pod.why_unusable()
        if problem is not None:
            raise KubectlError(f"{problem}: broker {host}:{port} is unreachable until it is "
                               f"(`kubectl describe pod {pod.name}` says why)",
                               pending=True)  # fmt: skip
        return pod.name

    def _key(self, host: str, port: int) -> tuple[str, int]:
        """One forward per pod and port, however the pod is named: the default bootstrap
        `kafka-0:9092` and broker `kafka-0.kafka-headless...:9092` share kafka-0's."""
        pod = pod_for(host, port, self.pods)
        return (f"pod/{pod.name}", port) if pod is not None else (host, port)

    def _forward(self, host: str, port: int) -> PortForward:
        key = self._key(host, port)
        forward = self.forwards.get(key)
        if self._sleep_watch is None:  # from the first forward on
            loop = asyncio.get_running_loop()
            self._sleep_watch = loop.create_task(self._watch_sleep())
            if self.follows_pods:
                self._follow_task = loop.create_task(self._follow_pods())
        if forward is None:
            forward = PortForward(
                self.kubectl,
                lambda: self._resolve(host, port),
                self._pod_port(host, port),
                on_down=lambda: self._close_through(key),
                backoff=self.backoff,
                keepalive=self.keepalive,
                probe=self._probe_for(host, port),
                starting=lambda: self._starting(key),
            )
            self.forwards[key] = forward
            forward.start()
        return forward

    def _pod_port(self, host: str, port: int) -> int:
        """The pod's port a forward to host:port reaches: a broker's advertised port."""
        return port

    def _probe_for(self, host: str, port: int) -> Probe | None:
        """How a forward to host:port is checked (None: ApiVersions, for a broker)."""
        return None

    def expect(self, host: str, port: int) -> None:
        self._forward(host, port)  # start its port-forward now: the first client won't wait

    def suspect(self, host: str, port: int, signal: str) -> None:
        forward = self.forwards.get(self._key(host, port))
        if forward is not None:
            forward.check(signal)

    def _close_through(self, key: tuple[str, int]) -> None:
        """The forward died: close its connections at once so their clients reconnect."""
        for upstream in list(self._through.get(key, ())):
            upstream.close()

    async def open(self, host: str, port: int) -> Upstream:
        """A stream through the broker's forward; a forward that is (re)starting is waited
        for, up to ready_timeout in all, rather than failing the client at once."""
        forward = self._forward(host, port)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout
        while True:
            try:
                local = await forward.wait_ready(max(deadline - loop.time(), 0.0))
            except TimeoutError as error:
                raise ForwarderError(str(error)) from None
            except KubectlError as error:
                raise ForwarderError(str(error), permanent=error.permanent) from None
            try:
                upstream = await self._tcp.open("127.0.0.1", local)
                break
            except ForwarderError:
                if loop.time() >= deadline:  # the forward died as we connected, and stayed down
                    raise ForwarderError(
                        f"the port-forward to {forward.describe()} went away and did not come "
                        f"back within {self.ready_timeout:g}s: {forward.last_error or 'no error'}"
                    ) from None
                await asyncio.sleep(0.05)  # it is being restarted: wait for it again
        through = self._through.setdefault(self._key(host, port), set())
        through.add(upstream)
        task = asyncio.get_running_loop().create_task(upstream.wait_closed())
        task.add_done_callback(lambda _: through.discard(upstream))
        return upstream

    def restarts(self, host: str, port: int) -> int:
        forward = self.forwards.get(self._key(host, port))
        return forward.restarts if forward else 0

    def replacements(self, host: str, port: int) -> int:
        forward = self.forwards.get(self._key(host, port))
        return forward.replacements if forward else 0

    def describe(self, host: str, port: int) -> str:
        forward = self.forwards.get(self._key(host, port))
        return forward.describe() if forward else f"kubectl (pod of {host})"

    async def _watch_sleep(self) -> None:
        before = self.asleep()
        while True:
            await asyncio.sleep(self.sleep_check)
            now = self.asleep()
            if now - before > WAKE_THRESHOLD:
                log.info("woke after %.0fs asleep: checking every port-forward", now - before)
                for forward in self.forwards.values():
                    forward.check("waking from sleep")
            before = now

    # -- following the pods (pod_follow.py) --------------------------------------------------

    def _starting(self, key: tuple[str, int]) -> bool:
        kind, _, name = key[0].partition("/")
        return kind == "pod" and self.follower.starting(name, time.monotonic())

    def _decide(self, decisions: list[Decision]) -> None:
        """Act on what the pods' changes mean for the forwards to them."""
        for decision in decisions:
            for (target, _port), forward in self.forwards.items():
                if target != f"pod/{decision.pod}":
                    continue
                if isinstance(decision, Replace) and forward.pod == decision.pod:
                    forward.replace(decision.why)
                elif isinstance(decision, Wake):
                    forward.wake(decision.why)

    async def _follow_pods(self) -> None:
        """Watch the broker pods where RBAC allows it; else list them every POLL_EVERY while
        a broker is down. Never fatal: the forwards still find a pod by failing."""
        try:
            may_watch = await self.kubectl.can_i("watch", "pods")
        except (KubectlError, OSError) as error:
            log.debug("cannot ask whether pods may be watched (%s): listing them instead", error)
            may_watch = False
        if may_watch:
            await self._watch_pods()  # returns only when the watch is refused
        self.following = "listing"
        log.info("following the broker pods by listing them every %gs while one is down "
                 "(RBAC grants no watch on pods)", POLL_EVERY)  # fmt: skip
        while True:
            await asyncio.sleep(POLL_EVERY)
            down = any(f.local_port is None for f in self.forwards.values())
            if not down and not any(self._starting(key) for key in self.forwards):
                continue
            try:
                pods = await self._list()
            except (KubectlError, OSError) as error:
                log.debug("listing the broker pods failed: %s", error)
                continue
            self.pods = pods
            self._decide(self.follower.listed(pods, time.monotonic()))

    async def _watch_pods(self) -> None:
        """`kubectl get pods --watch` for as long as the tunnel runs, started again when it
        ends (the API server ends watches every half hour or so); returns when the watch
        is refused or kubectl's output is not watch events: the caller lists instead."""
        args = ("get", "pods", "-l", self.selector or DEFAULT_SELECTORS[0], "--watch",
                "--output-watch-events", "-o", "json")  # fmt: skip
        pause = 1.0
        while True:
            process = await self.kubectl.start(*args)
            assert process.stdout is not None and process.stderr is not None
            stream, began = WatchStream(), time.monotonic()
            try:
                while chunk := await process.stdout.read(65536):
                    self.following = "watch"  # kubectl watches: its first events came
                    now = time.monotonic()
                    for event in stream.feed(chunk):
                        if not event.pod.is_broker():
                            continue
                        if event.kind == "DELETED":
                            self._decide(self.follower.gone(event.pod.name, now))
                        else:
                            self._decide(self.follower.seen(event.pod, now))
                    self.pods = self.follower.pods()
            except WatchStreamError as error:
                log.warning("following the broker pods: %s; listing them instead", error)
                return
            finally:
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                stderr = (await process.stderr.read()).decode(errors="replace")
                await process.wait()
            problem = explain(stderr, args) if stderr.strip() else None
            if problem is not None and problem.permanent:
                log.info("following the broker pods: %s; listing them instead", problem)
                return
            # a watch that ran a while ended as watches do: again at once; else wait, more
            pause = 1.0 if time.monotonic() - began > 60 else min(pause * 2, 30.0)
            log.debug("the watch of the broker pods ended (%s): again in %gs",
                      problem or f"kubectl exited with {process.returncode}", pause)  # fmt: skip
            await asyncio.sleep(pause)

    async def close(self) -> None:
        for task in (self._sleep_watch, self._follow_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await asyncio.gather(*(f.stop() for f in self.forwards.values()))
