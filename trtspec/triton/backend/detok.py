"""Streaming detokenization that concatenates to exactly ``decode(all ids)``.

Decoding each streamed chunk on its own breaks characters whose UTF-8 bytes span tokens (and
SentencePiece's leading-space rule). Instead the router sends postprocessing a short window: a
few ids already sent (context) plus the new ones; the delta is the window's text minus the
context's text. The same function of the ids decides what is held back (a trailing incomplete
character, shown as U+FFFD until its last byte arrives), so postprocessing stays stateless.
"""

from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"
# Ids of context before the new ones: more than any held-back character can span (<= 4 bytes).
CONTEXT = 8


def text_delta(decode: Callable[[Sequence[int]], str], ids: Sequence[int], context_len: int, final: bool) -> str:
    """Text of ``ids[context_len:]`` given that ``ids[:context_len]`` was already sent.

    Trailing U+FFFD (an incomplete character) is held back unless ``final``.
    """
    prev = decode(ids[:context_len]).rstrip(REPLACEMENT) if context_len else ""
    cur = decode(ids)
    if not final:
        cur = cur.rstrip(REPLACEMENT)
    if cur.startswith(prev):
        return cur[len(prev):]
    # not prefix-stable (a tokenizer that rewrites text across the boundary): send what differs
    i = 0
    while i < min(len(prev), len(cur)) and prev[i] == cur[i]:
        i += 1
    return cur[i:]


class DetokWindow:
    """Router-side bookkeeping: which ids postprocessing gets with each response."""

    def __init__(self, prefix: Sequence[int] = (), context: int = CONTEXT):
        self.history: list[int] = list(prefix)  # prompt ids when the prompt is echoed, then outputs
        self.sent = 0  # ids of history already rendered as text
        self.context = context

    def next(self, new_ids: Sequence[int]) -> tuple[list[int], int]:
        """(window ids, context length) for a response carrying ``new_ids``."""
        start = max(0, self.sent - self.context)
        self.history.extend(int(i) for i in new_ids)
        window = self.history[start:]
        ctx = self.sent - start
        self.sent = len(self.history)
        return window, ctx
