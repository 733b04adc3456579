"""serving.stream_interval's coalescer: several engine steps' events handed on as one."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from trtspec.triton.backend.coalesce import Coalescer, coalesced


@dataclass
class Ev:
    new_tokens: list
    finished: bool = False
    new_logprobs: list | None = None
    stats: int = 0


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def run(interval, events, clock=None, answer=None):
    got = []

    def cb(ev):
        got.append(ev)
        return answer

    c = Coalescer(cb, interval, clock=clock or Clock())
    answers = [c(e) for e in events]
    return got, answers


def test_first_passes_at_once_then_every_interval_and_the_last_with_what_was_held():
    evs = [Ev([i], stats=i) for i in range(1, 8)] + [Ev([8], finished=True, stats=8)]
    got, _ = run(3, evs)
    assert [e.new_tokens for e in got] == [[1], [2, 3, 4], [5, 6, 7], [8]]
    assert [e.stats for e in got] == [1, 4, 7, 8]  # the newest counters travel with the tokens
    got, _ = run(3, evs[:5] + [Ev([6], finished=True)])
    assert [e.new_tokens for e in got] == [[1], [2, 3, 4], [5, 6]] and got[-1].finished
    assert sum(len(e.new_tokens) for e in got) == 6  # nothing lost, nothing twice


def test_logprobs_travel_with_their_tokens():
    evs = [Ev([1], new_logprobs=[-0.1]), Ev([2, 3], new_logprobs=[-0.2, -0.3]), Ev([4], True, [-0.4])]
    got, _ = run(4, evs)
    assert [(e.new_tokens, e.new_logprobs) for e in got] == [([1], [-0.1]), ([2, 3, 4], [-0.2, -0.3, -0.4])]


def test_non_streaming_holds_until_the_end_or_hold_s():
    clock = Clock()
    evs = [Ev([i]) for i in range(1, 6)] + [Ev([6], finished=True)]
    got = []
    c = Coalescer(got.append, None, hold_s=0.2, clock=clock)
    for i, e in enumerate(evs):
        clock.t = i * 0.05
        c(e)
    # the first at once (t=0); at t=0.2 hold_s has passed since: everything held; the last at the end
    assert [e.new_tokens for e in got] == [[1], [2, 3, 4, 5], [6]] and got[-1].finished


def test_a_stop_answer_is_returned_until_the_next_hand_on():
    got, answers = run(4, [Ev([1]), Ev([2]), Ev([3])], answer=False)
    assert answers == [False, False, False]  # the engine stops the request at its next step


def test_interval_one_streaming_is_the_callback_itself_and_bad_intervals_are_refused():
    def cb(ev):
        return None

    assert coalesced(cb, 1, True) is cb
    assert isinstance(coalesced(cb, 1, False), Coalescer) and isinstance(coalesced(cb, 4, True), Coalescer)
    with pytest.raises(ValueError):
        Coalescer(cb, 0)
