"""The output of `kubectl get pods --watch --output-watch-events -o json`, as events.

kubectl prints each watch event as one pretty-printed JSON object, `{"type": "ADDED" |
"MODIFIED" | "DELETED", "object": {...pod...}}`, one after another with no separator other
than a newline, and a pipe hands them over in chunks that cut anywhere. Sans-I/O: bytes in,
events out; the caller reads kubectl."""

from __future__ import annotations

import json
from dataclasses import dataclass

from kafkatunnel.kube.pods import Pod, parse_pods

MAX_PENDING = 1024 * 1024  # characters of one unfinished event: a pod is a few kB


class WatchStreamError(ValueError):
    """kubectl's output is not a stream of watch events (its version or a proxy says so)."""


@dataclass(frozen=True)
class PodEvent:
    kind: str  # ADDED, MODIFIED, DELETED (a BOOKMARK carries no pod and is dropped)
    pod: Pod


class WatchStream:
    def __init__(self) -> None:
        self._pending = ""
        self._undecoded = b""  # an UTF-8 sequence cut by the chunk's end
        self._decoder = json.JSONDecoder()

    def feed(self, data: bytes) -> list[PodEvent]:
        """The events completed by `data`; WatchStreamError if what came is not events."""
        data, self._undecoded = self._undecoded + data, b""
        try:
            text = data.decode()
        except UnicodeDecodeError as error:
            if error.end < len(data) or len(data) - error.start > 3:
                raise WatchStreamError(f"kubectl's output is not UTF-8: {error}") from None
            text, self._undecoded = data[: error.start].decode(), data[error.start :]
        self._pending += text
        events: list[PodEvent] = []
        while True:
            self._pending = self._pending.lstrip()
            if not self._pending:
                return events
            if not self._pending.startswith("{"):
                raise WatchStreamError(f"kubectl printed {self._pending[:80]!r}, not a watch event")
            try:
                value, end = self._decoder.raw_decode(self._pending)
            except json.JSONDecodeError as error:
                if len(self._pending) > MAX_PENDING:
                    raise WatchStreamError(
                        f"a watch event longer than {MAX_PENDING} characters: {error}"
                    ) from None
                return events  # the rest is still to come
            self._pending = self._pending[end:]
            event = _event(value)
            if event is not None:
                events.append(event)


def _event(value: object) -> PodEvent | None:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise WatchStreamError(f"kubectl printed a JSON value that is not a watch event: "
                               f"{json.dumps(value)[:80]}")  # fmt: skip
    kind = value["type"]
    if kind not in ("ADDED", "MODIFIED", "DELETED"):
        return None  # BOOKMARK (and ERROR, which kubectl itself reports and exits on)
    obj = value.get("object")
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        raise WatchStreamError(f"a {kind} event without a pod: {json.dumps(value)[:80]}")
    try:
        (pod,) = parse_pods({"items": [obj]})
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise WatchStreamError(f"a {kind} event whose pod cannot be read: {error!r}") from None
    return PodEvent(kind, pod)
