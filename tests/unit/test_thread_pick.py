"""pick_thread_count: one thread replaces the configured count only where it is clearly faster
(a pass at most 0.9x as long). A reading within noise keeps the user's count: taken while another
engine worker loaded its weights, such a reading once put the served Qwen target on 1 thread of 2."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from trtspec.speculative.engine import pick_thread_count


def _engine(seconds_by_threads: dict[int, float]):
    def target(ids, cache, step, logits=None):
        time.sleep(seconds_by_threads[torch.get_num_threads()])

    cache = SimpleNamespace(k=[torch.zeros(1)])
    return SimpleNamespace(cache=cache, slots=[None], target=target)


@pytest.fixture
def two_threads():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(saved)


@pytest.mark.parametrize("one, two, chosen", [
    (0.004, 0.010, 1),   # one thread far faster: picked
    (0.010, 0.004, 2),   # the configured count faster: kept
    (0.0095, 0.010, 2),  # one thread 5 % faster, within noise: the configured count is kept
])
def test_one_thread_must_win_by_the_margin(two_threads, one, two, chosen):
    got = pick_thread_count(_engine({1: one, 2: two}), repeats=2)
    assert got["threads"] == chosen and torch.get_num_threads() == chosen
    assert got["configured"] == 2


def test_nothing_to_pick_with_one_configured_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert pick_thread_count(_engine({1: 0.001})) is None
    finally:
        torch.set_num_threads(saved)
