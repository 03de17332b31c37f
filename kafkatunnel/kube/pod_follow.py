"""What a change of the broker pods means for their port-forwards: follow the pods, not the
failures.

A forward learns of a restarted broker only by failing: while the new pod's JVM is not
yet listening every attempt ends in "connection refused" inside the pod, and a backoff
that grows with the failures (to 30 s) then makes the tunnel reach the broker long after
it is Ready. A forward left on a pod that was deleted and made again under its name fails
the first connection through it. What the pods do is known: `kubectl get pods --watch`
(or a listing, where RBAC grants no watch) says it. From it:

- a pod deleted, or made again (a new UID), has its forward replaced now (`Replace`);
- a pod that turned Ready, or came back Ready, has its forward tried now (`Wake`);
- a pod not Ready, made again, or whose container restarted is *starting* until
  STARTING_FOR seconds after it was last seen so, and while it is, a forward to it never
  backs off past a second.

Sans-I/O: pods and the time in, decisions out; the forwarder acts on them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kafkatunnel.kube.pods import Pod

STARTING_FOR = 300.0  # seconds a pod counts as starting after it was last seen changing


@dataclass(frozen=True)
class Wake:
    """A forward waiting to reach this pod should try again now."""

    pod: str
    why: str


@dataclass(frozen=True)
class Replace:
    """A forward running to this pod reaches one that is gone: start it again."""

    pod: str
    why: str


Decision = Wake | Replace


class PodFollower:
    def __init__(self, pods: Iterable[Pod]) -> None:
        self._known: dict[str, Pod] = {pod.name: pod for pod in pods}
        self._starting_until: dict[str, float] = {}

    def pods(self) -> list[Pod]:
        return sorted(self._known.values(), key=lambda pod: pod.name)

    def starting(self, name: str, now: float) -> bool:
        """Whether the pod was seen starting (or going) within the last STARTING_FOR."""
        return now < self._starting_until.get(name, float("-inf"))

    def seen(self, pod: Pod, now: float) -> list[Decision]:
        """A pod as the cluster now has it (a watch's ADDED or MODIFIED, or a listing)."""
        old = self._known.get(pod.name)
        self._known[pod.name] = pod
        decisions: list[Decision] = []
        made_again = old is not None and old.uid is not None and old.uid != pod.uid
        if made_again:
            decisions.append(Replace(pod.name, f"pod {pod.name} was made again"))
        restarted = old is not None and not made_again and pod.restarts > old.restarts
        if made_again or restarted or pod.why_unusable() is not None:
            self._starting_until[pod.name] = now + STARTING_FOR
        if pod.why_unusable() is None and (
            old is None or made_again or restarted or old.why_unusable() is not None
        ):
            decisions.append(Wake(pod.name, f"pod {pod.name} is Ready"))
        return decisions

    def gone(self, name: str, now: float) -> list[Decision]:
        """A pod deleted (a watch's DELETED, or missing from a listing)."""
        if self._known.pop(name, None) is None:
            return []
        self._starting_until[name] = now + STARTING_FOR  # its controller makes it again
        return [Replace(name, f"pod {name} was deleted")]

    def listed(self, pods: Iterable[Pod], now: float) -> list[Decision]:
        """A whole listing of the broker pods: those missing from it are gone."""
        pods = list(pods)
        decisions: list[Decision] = []
        for name in sorted(set(self._known) - {pod.name for pod in pods}):
            decisions += self.gone(name, now)
        for pod in pods:
            decisions += self.seen(pod, now)
        return decisions
