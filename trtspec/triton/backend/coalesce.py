"""Fewer hops per token: a request's engine events, several steps to one.

Every event a served engine hands on becomes a frame to the stub (worker mode), a Triton response,
a gRPC message to the router, a response of the router and one of postprocessing: five hops,
each a wake-up of a Python process on the cores the engine needs. :class:`Coalescer` sits where
the engine calls back and hands on one event per ``interval`` steps, carrying their tokens
together (``serving.stream_interval``, TensorRT-LLM's ``stream_interval``):

* the first event (the prefill's token) passes at once: time to first token is unchanged;
* the last event (finished, stopped, failed) passes at once, with everything held before it;
* a streaming request otherwise every ``interval`` steps; a non-streaming one (``interval``
  None) only then, since its client sees the final response alone;
* anything held longer than ``hold_s`` passes anyway, so the stub keeps seeing a live request
  (it checks for a gone client on each event) and a slow step never delays tokens by more.

Torch-free: the events are the engine's ``Event`` or any dataclass with ``new_tokens``,
``new_logprobs`` and ``finished``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable


class Coalescer:
    """Wraps one request's event callback; returns what the callback last returned (None keeps
    the request going, False stops it), so cancellation reaches the engine as before."""

    def __init__(self, callback: Callable, interval: int | None, hold_s: float = 0.2,
                 clock: Callable[[], float] = time.monotonic):
        if interval is not None and interval < 1:
            raise ValueError(f"interval must be >= 1 or None, got {interval}")
        self.callback, self.interval, self.hold_s, self.clock = callback, interval, hold_s, clock
        self.tokens: list[int] = []
        self.logprobs: list[float] | None = None
        self.steps = 0  # events held
        self.passed = 0  # events handed on
        self.last = clock()
        self.answer = None

    def __call__(self, ev):
        self.tokens.extend(ev.new_tokens)
        if ev.new_logprobs is not None:
            self.logprobs = (self.logprobs or []) + list(ev.new_logprobs)
        self.steps += 1
        now = self.clock()
        due = (ev.finished or self.passed == 0 or (self.interval is not None and self.steps >= self.interval)
               or now - self.last >= self.hold_s)
        if not due:
            return self.answer
        merged = ev if self.steps == 1 else dataclasses.replace(ev, new_tokens=self.tokens, new_logprobs=self.logprobs)
        self.tokens, self.logprobs, self.steps, self.last = [], None, 0, now
        self.passed += 1
        self.answer = self.callback(merged)
        return self.answer


def coalesced(callback: Callable, interval: int, streaming: bool) -> Callable:
    """``callback`` itself when every step is to be handed on (a streaming request, interval 1),
    else a :class:`Coalescer` around it."""
    if streaming and interval <= 1:
        return callback
    return Coalescer(callback, interval if streaming else None)
