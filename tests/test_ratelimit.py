"""Repeats, the judge of what to say of events that repeat (client connections failing the
same way): the first of a kind at once, the same again within the window only counted, one
count when the window ends, nothing lost and nothing said twice."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkatunnel.ratelimit import First, More, Repeats

pytestmark = pytest.mark.quick

WINDOW = 30.0


def test_the_first_is_said_at_once_and_the_same_again_only_counted() -> None:
    repeats: Repeats[str, str] = Repeats(WINDOW)
    first = "peer 1: refused"
    assert repeats.note("refused", first, 100.0) == [First("refused", first)]
    for i in range(149):
        assert repeats.note("refused", f"peer {i + 2}: refused", 100.0 + i / 50) == []
    assert repeats.due(129.9) == []
    assert repeats.due(130.0) == [More("refused", first, 149, WINDOW)]


def test_a_window_with_none_more_ends_silently_and_forgets_its_kind() -> None:
    repeats: Repeats[str, str] = Repeats(WINDOW)
    repeats.note("refused", "first", 0.0)
    assert repeats.due(30.0) == []
    assert repeats.next_due() is None
    assert repeats.note("refused", "again", 31.0) == [First("refused", "again")]


def test_a_flood_that_goes_on_is_counted_once_a_window_never_said_in_full_again() -> None:
    repeats: Repeats[str, str] = Repeats(WINDOW)
    said: list[First[str, str] | More[str, str]] = []
    for tenth in range(1200):  # ten a second for two minutes
        now = tenth / 10
        said += repeats.due(now)
        said += repeats.note("refused", f"at {now}", now)
    said += repeats.due(120.0)
    assert said[0] == First("refused", "at 0.0")
    assert said[1:] == [More("refused", "at 0.0", count, WINDOW) for count in (299, 300, 300, 300)]
    assert repeats.due(150.0) == []  # the last window held none: forgotten
    assert repeats.next_due() is None


def test_kinds_are_judged_apart() -> None:
    repeats: Repeats[tuple[str, str], str] = Repeats(WINDOW)
    a, b = ("a", "refused"), ("b", "refused")
    assert repeats.note(a, "a refused", 0.0) == [First(a, "a refused")]
    assert repeats.note(b, "b refused", 1.0) == [First(b, "b refused")]
    assert repeats.note(("a", "tls"), "a tls", 2.0) == [First(("a", "tls"), "a tls")]
    assert repeats.note(("a", "refused"), "a refused 2", 3.0) == []
    assert repeats.next_due() == 30.0
    assert repeats.due(31.5) == [More(("a", "refused"), "a refused", 1, WINDOW)]
    assert repeats.next_due() == 32.0  # a/tls's; a/refused's next window ends at 60


def test_an_event_at_the_window_end_belongs_to_the_next_window() -> None:
    repeats: Repeats[str, str] = Repeats(WINDOW)
    repeats.note("refused", "first", 0.0)
    repeats.note("refused", "second", 29.999)
    assert repeats.note("refused", "third", 30.0) == [More("refused", "first", 1, WINDOW)]
    assert repeats.due(60.0) == [More("refused", "first", 1, WINDOW)]


def test_a_window_ended_before_the_caller_looked_is_counted_before_the_new_event() -> None:
    """The timer may come after the next event: the count it would have said comes first,
    and the event falls in the window after."""
    repeats: Repeats[str, str] = Repeats(WINDOW)
    repeats.note("refused", "first", 0.0)
    repeats.note("refused", "second", 10.0)
    assert repeats.note("refused", "late", 45.0) == [More("refused", "first", 1, WINDOW)]
    assert repeats.due(60.0) == [More("refused", "first", 1, WINDOW)]


def test_long_after_a_count_the_next_is_said_in_full() -> None:
    repeats: Repeats[str, str] = Repeats(WINDOW)
    repeats.note("refused", "first", 0.0)
    repeats.note("refused", "second", 10.0)
    assert repeats.note("refused", "much later", 100.0) == [
        More("refused", "first", 1, WINDOW),
        First("refused", "much later"),
    ]


def test_next_due_is_the_first_window_to_end() -> None:
    repeats: Repeats[str, str] = Repeats(WINDOW)
    assert repeats.next_due() is None
    repeats.note("b", "b", 5.0)
    repeats.note("a", "a", 7.0)
    assert repeats.next_due() == 35.0
    repeats.due(35.0)
    assert repeats.next_due() == 37.0


def test_flush_says_the_counts_over_the_time_they_cover_and_forgets_all() -> None:
    repeats: Repeats[str, str] = Repeats(WINDOW)
    repeats.note("a", "a first", 0.0)
    repeats.note("a", "a again", 1.0)
    repeats.note("a", "a again", 2.0)
    repeats.note("b", "b first", 5.0)  # none more: nothing to say
    assert repeats.flush(12.5) == [More("a", "a first", 2, 12.5)]
    assert repeats.next_due() is None
    assert repeats.flush(13.0) == []
    assert repeats.note("a", "a after", 14.0) == [First("a", "a after")]


def test_flush_after_a_window_ended_says_its_count_over_the_window() -> None:
    repeats: Repeats[str, str] = Repeats(WINDOW)
    repeats.note("a", "a first", 0.0)
    repeats.note("a", "a again", 1.0)
    assert repeats.flush(31.0) == [More("a", "a first", 1, WINDOW)]


def test_past_the_kinds_held_a_new_kind_is_said_in_full_each_time() -> None:
    repeats: Repeats[str, str] = Repeats(WINDOW, kinds=2)
    repeats.note("a", "a", 0.0)
    repeats.note("b", "b", 0.0)
    assert repeats.note("c", "c", 1.0) == [First("c", "c")]
    assert repeats.note("c", "c", 2.0) == [First("c", "c")]  # not held: nothing lost
    assert repeats.note("a", "a", 3.0) == []  # those held are still counted
    assert repeats.due(30.0) == [More("a", "a", 1, WINDOW)]
    assert repeats.note("c", "c", 31.0) == [First("c", "c")]  # b's window ended: room
    assert repeats.note("c", "c", 32.0) == []


events = st.lists(
    st.tuples(st.sampled_from("abc"), st.floats(0, 200, allow_nan=False), st.booleans()),
    max_size=300,
)


@given(events, st.floats(0, 300, allow_nan=False))
def test_every_event_is_told_once_and_each_kind_in_full_at_most_once_a_window(
    happened: list[tuple[str, float, bool]], stop: float
) -> None:
    """Whatever the order of events and of the caller's looks at the clock: each event is
    said in full or counted, exactly once, and a kind is said in full again only after a
    whole window without being said."""
    repeats: Repeats[str, int] = Repeats(WINDOW)
    said: list[tuple[float, First[str, int] | More[str, int]]] = []
    now = 0.0
    for i, (key, at, look) in enumerate(sorted(happened, key=lambda e: e[1])):
        now = at
        if look:
            said += [(now, line) for line in repeats.due(now)]
        said += [(now, line) for line in repeats.note(key, i, now)]
    said += [(now, line) for line in repeats.flush(max(now, stop))]
    told = sum(1 if isinstance(line, First) else line.count for _, line in said)
    assert told == len(happened)
    for key in "abc":
        firsts = [at for at, line in said if isinstance(line, First) and line.key == key]
        assert all(later - earlier >= WINDOW for earlier, later in itertools.pairwise(firsts))
        counts = [line for _, line in said if isinstance(line, More) and line.key == key]
        assert all(line.count > 0 and line.seconds <= WINDOW for line in counts)
