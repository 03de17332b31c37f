"""A call refused with an authorization error (by a broker's authorizer, or by the tunnel's
`--read-only` in the broker's place) says nothing of where it went: verify judges none of
it, so a refusal on a connection to any broker is no misroute."""

from __future__ import annotations

import pytest

from kafkatunnel.protocol import Policy, parse_request_header, refusal
from kafkatunnel.verify.calls import Call, Conn
from kafkatunnel.verify.events import CALL, LOOKUP, Event, events_of
from kafkatunnel.verify.judge import MISROUTED, Facts, judge
from tests.kio_messages import request_frame
from tests.protocol.requests_built import built

pytestmark = pytest.mark.quick
GROUP = 0


def test_a_refused_commit_is_no_call_and_no_misroute() -> None:
    policy = Policy.of(read_only=True)
    assert policy is not None
    admin = {"group_id": "g", "member_id": "", "generation_id_or_member_epoch": -1}
    commit = request_frame(built(8, 9, **admin), 5)
    answer = refusal(commit, parse_request_header(commit), policy.reason)
    to_broker_2 = Conn("c1", "127.0.0.1:5000", "127.0.0.1:9095", 2, True)
    call = Call(to_broker_2, 8, 9, 5, 1_000, commit, 2_000, answer)

    events = events_of(call)

    assert [e for e in events if e.kind == CALL] == []
    # FindCoordinator named broker 0; the refused commit went to broker 2's listener
    named = Event(LOOKUP, 500, to_broker_2, 10, "g", GROUP, 0, 0, "127.0.0.1:9093")
    verdict = judge("g", GROUP, [named, *events], Facts())
    assert verdict.verdict != MISROUTED, verdict.reasons
