"""Each rule of the verdict, on events built by hand (the decoding is tested on real
recordings elsewhere): what makes a group ok, misrouted or unverified."""

from __future__ import annotations

from typing import Any

import pytest

from kafkatunnel.protocol import partition_for
from kafkatunnel.verify.calls import Conn
from kafkatunnel.verify.events import CALL, LOOKUP, Event
from kafkatunnel.verify.judge import MISROUTED, OK, UNVERIFIED, Facts, LeaderSnapshot, judge

pytestmark = pytest.mark.quick

JOIN, SYNC, HEARTBEAT, COMMIT = 11, 14, 12, 8


def conn(node: int | None, server: str = "127.0.0.1:1", run: str = "r1") -> Conn:
    return Conn(f"{run}/127.0.0.1:5/c{node}{server}", "127.0.0.1:5", server, node, tunnel=True)


def lookup(ts: int, node: int, error: int = 0, run: str = "r1", client: str = "app") -> Event:
    return Event(LOOKUP, ts, conn(None, run=run), 10, "g", 0, error, node, f"127.0.0.1:{node}",
                 client_id=client)  # fmt: skip


def call(ts: int, node: int | None, api: int = HEARTBEAT, error: int | None = 0,
         detail: dict[str, Any] | None = None, run: str = "r1") -> Event:  # fmt: skip
    return Event(CALL, ts, conn(node, run=run), api, "g", 0, error, detail=detail)


def test_requests_to_the_named_coordinator_are_ok() -> None:
    verdict = judge("g", 0, [lookup(1, 2), call(2, 2, JOIN), call(3, 2, SYNC)], Facts())
    assert (verdict.verdict, verdict.checked, verdict.coordinator) == (OK, 2, 2)


def test_a_request_to_another_broker_is_misrouted() -> None:
    verdict = judge("g", 0, [lookup(1, 2), call(2, 2), call(3, 1, COMMIT)], Facts())
    assert verdict.verdict == MISROUTED
    assert verdict.reasons == ["OffsetCommit went to broker 1, but FindCoordinator named broker 2"]


def test_the_latest_lookup_counts_after_a_coordinator_moves() -> None:
    events = [lookup(1, 2), call(2, 2), call(3, 2, error=16), lookup(4, 3), call(5, 3)]
    verdict = judge("g", 0, events, Facts())
    assert verdict.verdict == OK and verdict.errors["NOT_COORDINATOR"] == 1
    assert verdict.reasons == ["1 NOT_COORDINATOR answer(s), then recovered"]


INFERRED = "10.0.0.9:9092"  # a plain capture's address, taken for broker 2 by inference


def inferred(ts: int, api: int = HEARTBEAT, error: int | None = 0) -> Event:
    return Event(CALL, ts, conn(None, INFERRED), api, "g", 0, error)


def denials(reach: Any, rounds: int = 3) -> list[Event]:
    """Broker 2 looked up again and again, and answering NOT_COORDINATOR each time."""
    events = []
    for round_ in range(rounds):
        events += [lookup(10 * round_, 2), reach(10 * round_ + 1, api=JOIN, error=16)]
    return events


def test_a_coordinator_that_keeps_denying_after_lookups_is_misrouted() -> None:
    """The single port-forward: the address taken for broker 2 leads to broker 1, which
    answers NOT_COORDINATOR however often the client looks broker 2 up again."""
    events = [*denials(inferred), lookup(40, 2), inferred(41)]  # even if one got through
    verdict = judge("g", 0, events, Facts(address_nodes={INFERRED: 2}))
    assert verdict.verdict == MISROUTED
    assert (
        "answered NOT_COORDINATOR 3 times although FindCoordinator kept naming it"
        in (verdict.reasons[0])
    )


def test_a_told_coordinator_that_keeps_denying_is_not_ready_not_misrouted() -> None:
    """A new __consumer_offsets, a restarted broker: the recording's listener shows the
    requests reached broker 2, the broker FindCoordinator named, which was still loading."""

    def told(ts: int, api: int, error: int) -> Event:
        return call(ts, 2, api, error)

    verdict = judge("g", 0, [*denials(told, 4), lookup(50, 2), call(51, 2)], Facts())
    assert verdict.verdict == OK, verdict.reasons
    assert verdict.errors["NOT_COORDINATOR"] == 4
    assert (
        "broker 2, which FindCoordinator named and the recording shows was reached"
        in (verdict.reasons[0])
    )
    assert "not ready yet" in verdict.reasons[0]


def test_an_address_the_user_names_is_told_not_inferred() -> None:
    from kafkatunnel.verify.identity import identify

    events = [*denials(inferred), lookup(40, 2), inferred(41)]
    user = Facts(identities=identify([INFERRED], user={INFERRED: 2}))
    assert judge("g", 0, events, user).verdict == OK  # --broker: broker 2, not ready
    guessed = Facts(identities=identify([INFERRED], advertised=[(2, INFERRED)]))
    assert judge("g", 0, events, guessed).verdict == MISROUTED


def test_a_last_answer_of_not_coordinator_is_misrouted() -> None:
    events = [lookup(1, 2), inferred(2, JOIN, error=16)]
    verdict = judge("g", 0, events, Facts(address_nodes={INFERRED: 2}))
    assert verdict.verdict == MISROUTED and "never reached its coordinator" in verdict.reasons[0]
    told = judge("g", 0, [lookup(1, 2), call(2, 2, JOIN, error=16)], Facts())
    assert told.verdict == OK and "not ready yet" in told.reasons[0]


def test_without_a_lookup_or_metadata_nothing_is_verified() -> None:
    verdict = judge("g", 0, [call(2, 2)], Facts())
    assert verdict.verdict == UNVERIFIED
    assert verdict.reasons == ["no FindCoordinator answer for it was recorded before its requests"]
    only_lookups = judge("g", 0, [lookup(1, 2)], Facts())
    assert only_lookups.verdict == UNVERIFIED
    unknown = judge("g", 0, [lookup(1, 2), call(2, None)], Facts())
    assert unknown.verdict == UNVERIFIED and "does not identify" in unknown.reasons[-1]


def test_the_leader_of_the_groups_offsets_partition_decides_when_recorded() -> None:
    partition = partition_for("g", 50)
    facts = Facts(leaders={0: [LeaderSnapshot(0, 50, {partition: 3})]})
    assert judge("g", 0, [call(2, 3)], facts).verdict == OK  # no lookup, but the leader
    wrong = judge("g", 0, [lookup(1, 2), call(2, 2)], facts)
    assert wrong.verdict == MISROUTED
    assert f"broker 3 leads __consumer_offsets partition {partition}" in wrong.reasons[0]


def test_a_connection_without_a_node_is_identified_by_its_address() -> None:
    facts = Facts(address_nodes={"10.0.0.7:9092": 2})
    event = Event(CALL, 2, conn(None, "10.0.0.7:9092"), HEARTBEAT, "g", 0, 0)
    assert judge("g", 0, [lookup(1, 2), event], facts).verdict == OK


def _join(ts: int, member: str, generation: int, offered: list[str], chosen: str) -> Event:
    detail = {"member": member, "generation": generation, "offered": offered, "chosen": chosen}
    return call(ts, 2, JOIN, detail=detail)


def _sync(ts: int, member: str, generation: int, partitions: list[tuple[str, int]]) -> Event:
    detail = {"member": member, "generation": generation, "assignments": {},
              "assignment": partitions}  # fmt: skip
    return call(ts, 2, SYNC, detail=detail)


def test_a_partition_given_to_two_members_in_one_generation_fails() -> None:
    events = [lookup(1, 2), _sync(2, "a", 5, [("t", 0), ("t", 1)]), _sync(3, "b", 5, [("t", 1)])]
    verdict = judge("g", 0, events, Facts())
    assert verdict.verdict == MISROUTED
    assert verdict.reasons == ["generation 5 assigned t-1 to 2 members (a, b)"]
    fine = [lookup(1, 2), _sync(2, "a", 5, [("t", 0)]), _sync(3, "b", 6, [("t", 0)])]
    assert judge("g", 0, fine, Facts()).verdict == OK  # a new generation may move it


def test_a_protocol_a_member_did_not_offer_fails() -> None:
    events = [lookup(1, 2), _join(2, "a", 3, ["range", "roundrobin"], "roundrobin"),
              _join(3, "b", 3, ["range"], "roundrobin")]  # fmt: skip
    verdict = judge("g", 0, events, Facts())
    assert verdict.verdict == MISROUTED
    assert verdict.reasons == [
        "generation 3 chose protocol 'roundrobin', which member b did not offer (range)"
    ]


def test_an_address_that_is_not_the_tunnels_is_a_leak() -> None:
    from collections import Counter

    from kafkatunnel.verify.calls import FileSummary
    from kafkatunnel.verify.job import leaks_in

    listener = {"node_id": 1, "tunnel": "127.0.0.1:19093", "advertised": "kafka-0.k:9092",
                "mode": "rewrite"}  # fmt: skip
    named = Counter({("127.0.0.1:19093", 3, "tunnel"): 4, ("kafka-0.k:9092", 10, "tunnel"): 1,
                     ("10.0.0.5:9092", 3, "plain"): 2})  # fmt: skip
    summaries = [FileSummary("f", listeners=[listener])]
    assert leaks_in(named, summaries) == [
        {"address": "kafka-0.k:9092", "api": "FindCoordinator", "times": 1}
    ]
    transparent = [FileSummary("f", listeners=[listener | {"mode": "transparent"}])]
    assert leaks_in(named, transparent) == []  # clients see the names the DNS shim serves


@pytest.mark.parametrize(
    ("apis", "expected"),
    [
        ([JOIN, SYNC, HEARTBEAT, COMMIT], "classic"),
        ([68, COMMIT], "consumer"),
        ([76, 77], "share"),
        ([88, COMMIT, 89], "streams"),
        ([JOIN, SYNC, 68], "consumer"),  # a classic group upgraded online (KIP-848)
        ([COMMIT, 9], None),  # offsets only: the type is not in the recording
        ([90], "share"),  # DescribeShareGroupOffsets, answered
        ([69], "consumer"),  # ConsumerGroupDescribe, answered
    ],
)
def test_a_groups_type_comes_from_its_members_requests(
    apis: list[int], expected: str | None
) -> None:
    events = [lookup(0, 2)] + [call(ts + 1, 2, api) for ts, api in enumerate(apis)]
    verdict = judge("g", 0, events, Facts())
    assert verdict.group_type == expected
    assert verdict.as_dict()["group_type"] == expected


def test_a_failed_describe_does_not_say_the_type() -> None:
    """ConsumerGroupDescribe of a classic group answers GROUP_ID_NOT_FOUND (69)."""
    events = [lookup(0, 2), call(1, 2, 69, error=69)]
    assert judge("g", 0, events, Facts()).group_type is None
    txn = judge("t", 1, [Event(LOOKUP, 0, conn(None), 10, "t", 1, 0, 2, "a:1"),
                         Event(CALL, 1, conn(2), 22, "t", 1, 0)], Facts())  # fmt: skip
    assert txn.group_type is None and txn.as_dict()["kind"] == "transactional_id"


def _beat(ts: int, api: int, sent: int, epoch: int, error: int = 0) -> Event:
    return call(ts, 2, api, error, detail={"member": "m1", "sent": sent, "epoch": epoch})


@pytest.mark.parametrize("api", [68, 76, 88])
def test_a_member_epoch_answered_lower_than_sent_fails(api: int) -> None:
    fine = [lookup(0, 2), _beat(1, api, 0, 1), _beat(2, api, 1, 1), _beat(3, api, 1, 3),
            _beat(4, api, 3, -1), _beat(5, api, 0, 4)]  # fmt: skip
    verdict = judge("g", 0, fine, Facts())
    assert verdict.verdict == OK, verdict.reasons
    assert [m["epoch"] for m in verdict.timeline[1:]] == [1, 1, 3, -1, 4]
    fenced = [*fine, _beat(6, api, 4, 2, error=110)]  # FENCED_MEMBER_EPOCH: an answer
    assert judge("g", 0, fenced, Facts()).verdict == OK
    back = judge("g", 0, [*fine, _beat(6, api, 4, 2)], Facts())
    assert back.verdict == MISROUTED
    assert back.reasons == [
        "member m1 sent epoch 4 and was answered with epoch 2: a broker that did not know "
        "the group answered as its coordinator"
    ]


def refusals(*at: tuple[str, int], client: str | None = "app") -> Facts:
    """Connections meant for broker 2 that broker 0 refused (ApiVersions answered
    REBOOTSTRAP_REQUIRED, KIP-1242), each (run, when), made by the client whose client.id
    is `client`, collected as the job collects them."""
    from kafkatunnel.verify.events import MISDIRECTED
    from kafkatunnel.verify.job import facts_from

    events = [Event(MISDIRECTED, ts, conn(0, "127.0.0.1:9", run), 18, node=2, client_id=client)
              for run, ts in at]  # fmt: skip
    return facts_from(events, [])


def test_a_coordinator_whose_connections_another_broker_refused_is_misrouted() -> None:
    """Kafka 4.4 (KIP-1242): the client names the node it means in ApiVersions and a broker
    that is not it answers REBOOTSTRAP_REQUIRED; the client rebootstraps and tries again, so
    through one forward the group may never send a coordinator request, nor look up again
    (a share consumer does neither in 15 s, tests/apache/test_groups.py): without that
    evidence it would be unverified."""
    refused = refusals(("r1", 2), ("r1", 3), ("r1", 4))
    verdict = judge("g", 0, [lookup(1, 2)], refused)
    assert verdict.verdict == MISROUTED
    assert verdict.reasons[0].startswith(
        "FindCoordinator named broker 2, but 3 connection(s) meant for broker 2 reached "
        "another broker, which refused them"
    )
    assert judge("g", 0, [lookup(1, 2)], Facts()).verdict == UNVERIFIED
    reached = judge("g", 0, [lookup(1, 2), call(2, 2)], refused)  # others' connections
    assert reached.verdict == OK


def test_a_refusal_of_another_clients_connection_is_not_the_groups() -> None:
    """A doctor's smoke group looks a coordinator up as kafkatunnel-doctor and sends
    nothing: a refusal after it of another client's connection (one that rebootstrapped) is
    not a sign this group went astray; one of the looking client's own is."""
    doctor = [lookup(1, 2, client="kafkatunnel-doctor")]
    verdict = judge("g", 0, doctor, refusals(("r1", 2), client="app"))
    assert verdict.verdict == UNVERIFIED, verdict.reasons
    assert judge("g", 0, doctor, refusals(("r1", 2), client=None)).verdict == UNVERIFIED
    own = refusals(("r1", 2), client="kafkatunnel-doctor")
    assert judge("g", 0, doctor, own).verdict == MISROUTED


def test_an_answer_on_an_unidentified_connection_reached_a_coordinator() -> None:
    """A heartbeat answered without an error was accepted by a broker as the group's
    coordinator: whichever broker it was, the group's requests reached one."""
    verdict = judge("g", 0, [lookup(1, 2), call(3, None)], refusals(("r1", 2)))
    assert verdict.verdict == UNVERIFIED, verdict.reasons
    unanswered = [lookup(1, 2), call(3, None, error=None)]
    assert judge("g", 0, unanswered, refusals(("r1", 2))).verdict == MISROUTED


def test_refusals_in_another_run_or_before_the_lookup_are_not_the_groups() -> None:
    """Another recording's refusals (another run of the tunnel, another capture file), and
    those before the client's look-up that named the broker, are not the group's."""
    events = [lookup(10, 2), lookup(20, 2)]
    elsewhere = refusals(("r2", 15), ("r1", 5))  # another run, before
    verdict = judge("g", 0, events, elsewhere)
    assert verdict.verdict == UNVERIFIED, verdict.reasons
    assert judge("g", 0, events, refusals(("r2", 15), ("r1", 15))).verdict == MISROUTED
    assert judge("g", 0, events, refusals(("r1", 25))).verdict == MISROUTED  # after


def test_a_group_whose_requests_went_astray_after_a_refusal_is_misrouted() -> None:
    """Its coordinator's connection refused (REBOOTSTRAP_REQUIRED), the group's requests
    went on connections whose broker is not known, and none was answered."""
    events = [lookup(1, 2), call(3, None, JOIN, error=None), call(4, None, error=None)]
    verdict = judge("g", 0, events, refusals(("r1", 2)))
    assert verdict.verdict == MISROUTED
    assert "REBOOTSTRAP_REQUIRED" in verdict.reasons[0]


def test_the_job_collects_each_refusal_with_its_run_client_and_time() -> None:
    """What the job (Spark's driver, or the single process) gathers from MISDIRECTED
    events, for every group's judge: per run, node and client, when, in time order."""
    facts = refusals(("r1", 7), ("r2", 3), ("r1", 2))
    assert facts.misdirected == {("r1", 2, "app"): [2, 7], ("r2", 2, "app"): [3]}
