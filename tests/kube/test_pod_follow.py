"""What the broker pods' changes mean for their forwards (kafkatunnel/kube/pod_follow.py),
and kubectl's watch output read as events (kafkatunnel/kube/watch_stream.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkatunnel.kube.pod_follow import STARTING_FOR, PodFollower, Replace, Wake
from kafkatunnel.kube.pods import Pod, parse_pods
from kafkatunnel.kube.watch_stream import PodEvent, WatchStream, WatchStreamError

pytestmark = pytest.mark.quick


def pod(name: str = "kafka-1", *, uid: str = "a", ready: bool = True,
        phase: str = "Running", restarts: int = 0) -> Pod:  # fmt: skip
    return Pod(name, "10.0.0.1", (9092,), phase == "Running", phase=phase, ready=ready,
               uid=uid, restarts=restarts)  # fmt: skip


def test_the_pods_known_at_start_seen_again_change_nothing() -> None:
    follower = PodFollower([pod("kafka-0"), pod("kafka-1")])
    assert follower.seen(pod("kafka-1"), now=0) == []
    assert not follower.starting("kafka-1", now=0)


def test_a_pod_deleted_has_its_forward_replaced_and_is_starting_until_ready() -> None:
    follower = PodFollower([pod()])
    assert follower.gone("kafka-1", now=10) == [Replace("kafka-1", "pod kafka-1 was deleted")]
    assert follower.starting("kafka-1", now=10)
    assert follower.seen(pod(uid="b", phase="Pending", ready=False), now=20) == []
    assert follower.seen(pod(uid="b", ready=False), now=30) == []
    assert follower.starting("kafka-1", now=30 + STARTING_FOR - 1)
    assert follower.seen(pod(uid="b"), now=40) == [Wake("kafka-1", "pod kafka-1 is Ready")]
    assert follower.starting("kafka-1", now=40)  # Ready is not yet listening, without a probe


def test_a_pod_made_again_under_its_name_replaces_the_old_forward_and_wakes_it() -> None:
    """A watch that missed the DELETED (it was started again) sees a new UID."""
    follower = PodFollower([pod()])
    assert follower.seen(pod(uid="b"), now=5) == [
        Replace("kafka-1", "pod kafka-1 was made again"),
        Wake("kafka-1", "pod kafka-1 is Ready"),
    ]
    assert follower.starting("kafka-1", now=5)
    assert follower.seen(pod(uid="b"), now=6) == []


def test_a_restarted_container_is_a_starting_broker_its_forward_kept() -> None:
    follower = PodFollower([pod()])
    assert follower.seen(pod(restarts=1, ready=False), now=1) == []
    assert follower.starting("kafka-1", now=1)
    assert follower.seen(pod(restarts=1), now=2) == [Wake("kafka-1", "pod kafka-1 is Ready")]


def test_starting_ends_after_its_window() -> None:
    follower = PodFollower([pod()])
    follower.gone("kafka-1", now=0)
    assert follower.starting("kafka-1", now=STARTING_FOR - 0.1)
    assert not follower.starting("kafka-1", now=STARTING_FOR)
    assert not follower.starting("kafka-9", now=0)


def test_a_listing_is_a_look_at_every_pod_and_those_missing_are_gone() -> None:
    follower = PodFollower([pod("kafka-0"), pod("kafka-1")])
    decisions = follower.listed([pod("kafka-0", uid="c")], now=0)
    assert decisions == [Replace("kafka-1", "pod kafka-1 was deleted"),
                         Replace("kafka-0", "pod kafka-0 was made again"),
                         Wake("kafka-0", "pod kafka-0 is Ready")]  # fmt: skip
    assert [p.name for p in follower.pods()] == ["kafka-0"]
    assert follower.listed([pod("kafka-0", uid="c")], now=1) == []
    assert follower.gone("kafka-1", now=2) == []  # gone once


def item(name: str, uid: str, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid, "labels": {"app": "kafka"}},
            "spec": {"containers": [{"name": "kafka", "ports": [{"containerPort": 9092}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.9",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"restartCount": 2}]}}  # fmt: skip


def printed(*events: tuple[str, dict[str, Any]]) -> bytes:
    """As kubectl prints them: pretty JSON objects one after another."""
    return "\n".join(json.dumps({"type": kind, "object": obj}, indent=4, ensure_ascii=False)
                     for kind, obj in events).encode() + b"\n"  # fmt: skip


def test_kubectls_watch_output_is_read_as_events_whatever_the_chunks() -> None:
    out = printed(("ADDED", item("kafka-0", "u0")), ("MODIFIED", item("kafka-0", "u0", False)),
                  ("DELETED", item("kafka-0", "u0", False)))  # fmt: skip
    whole = WatchStream().feed(out)
    assert [(e.kind, e.pod.name, e.pod.uid, e.pod.ready, e.pod.restarts) for e in whole] == [
        ("ADDED", "kafka-0", "u0", True, 2), ("MODIFIED", "kafka-0", "u0", False, 2),
        ("DELETED", "kafka-0", "u0", False, 2)]  # fmt: skip
    for size in (1, 7, 100):
        stream, events = WatchStream(), []
        for start in range(0, len(out), size):
            events += stream.feed(out[start : start + size])
        assert events == whole, size


def test_a_name_cut_inside_a_utf8_character_is_read_whole() -> None:
    out = printed(("ADDED", {**item("kafka-0", "u0"), "metadata": {
        "name": "kafka-0", "uid": "u0", "labels": {"team": "ü€"}}}))  # fmt: skip
    cut = out.index("€".encode()) + 1
    stream = WatchStream()
    events = stream.feed(out[:cut]) + stream.feed(out[cut:])
    assert [dict(e.pod.labels)["team"] for e in events] == ["ü€"]


def test_bookmarks_are_dropped() -> None:
    out = printed(("BOOKMARK", {"metadata": {"resourceVersion": "7"}}), ("ADDED", item("k", "u")))
    assert [e.kind for e in WatchStream().feed(out)] == ["ADDED"]


@pytest.mark.parametrize("out", [
    b"error: unknown flag: --output-watch-events\n",
    b'{"apiVersion": "v1", "kind": "List", "items": []}',
    b"[1, 2]",
    b'{"type": "ADDED"}',
    b'{"type": "ADDED", "object": {"metadata": {"name": 7}, "status": []}}',
    b"\xff\xfe{",
])  # fmt: skip
def test_output_that_is_not_watch_events_is_one_clear_error(out: bytes) -> None:
    with pytest.raises(WatchStreamError):
        WatchStream().feed(out)


def test_an_event_that_never_ends_is_an_error_not_memory() -> None:
    stream = WatchStream()
    with pytest.raises(WatchStreamError, match="longer than"):
        for _ in range(20):
            stream.feed(b'{"type": "ADDED", "object": {"metadata": {"name": "' + b"x" * 100_000)


@given(st.binary(max_size=200))
def test_any_bytes_give_events_or_a_watch_stream_error(data: bytes) -> None:
    try:
        events = WatchStream().feed(data)
    except WatchStreamError:
        return
    assert all(isinstance(e, PodEvent) for e in events)


def test_an_event_reads_the_pod_as_a_listing_does() -> None:
    (listed,) = parse_pods({"items": [item("kafka-2", "u2")]})
    (event,) = WatchStream().feed(printed(("MODIFIED", item("kafka-2", "u2"))))
    assert event.pod == listed
