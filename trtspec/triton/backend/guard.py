"""What internal models check before they spend anything on a request (pure; numpy only).

The ensemble checks its inputs, but every composing model (``preprocessing``, the engine models)
is reachable on its own by anyone who reaches the server, so each checks what it receives as
strictly, and *before* the expensive part:

* ``preprocessing``: the byte length of ``text_input`` before decoding or tokenizing
  (``limits.max_prompt_bytes``): tokenizing a 500 MB prompt would stall the one instance;
* the engine models: tensor sizes before converting them to Python lists, and
  ``draft_input_ids`` in ``[0, vocab)`` and at most ``max_draft_len`` long: an out-of-range id
  fails the whole co-batched step (every request in it), a long draft allocates logits for it.

Each problem is a :class:`~trtspec.triton.backend.requests.RequestInputError` (INVALID_ARGUMENT).

:func:`is_fatal_device_error`: after a CUDA error of this kind the process's CUDA context is
unusable, and every later request fails while the stub looks alive; the engine model then exits
its stub so that the watchdog reloads the model (not exercised on this CPU-only machine).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from trtspec.triton.backend.requests import RequestInputError

DEFAULT_MAX_PROMPT_BYTES = 1_048_576
# errors after which a CUDA context cannot be trusted (PyTorch / driver wording)
FATAL_DEVICE_ERRORS = ("CUDA error", "device-side assert", "illegal memory access", "CUBLAS_STATUS_",
                       "CUDNN_STATUS_", "NCCL error", "unspecified launch failure", "misaligned address")


def is_fatal_device_error(text: str | None) -> bool:
    return bool(text) and any(m.lower() in text.lower() for m in FATAL_DEVICE_ERRORS)


def check_prompt_bytes(raw, limit: int) -> None:
    """``raw``: the ``text_input`` element as received (bytes or str)."""
    n = len(raw)
    if n > limit:
        raise RequestInputError(f"text_input is {n} bytes; this deployment takes at most {limit} "
                                "(limits.max_prompt_bytes)",
                                fix="shorten the prompt (or raise limits.max_prompt_bytes and re-package)")


def check_sizes(get: Callable[[str], "np.ndarray | None"], *, max_input_ids: int, max_draft_len: int) -> None:
    """Element counts of ``input_ids`` and ``draft_input_ids``, read from the arrays' shapes."""
    for name, limit in (("input_ids", max_input_ids), ("draft_input_ids", max_draft_len)):
        a = get(name)
        if a is not None and np.asarray(a).size > limit:
            raise RequestInputError(f"{name} has {np.asarray(a).size} ids; this model takes at most {limit}",
                                    fix=f"send at most {limit} {name}")


def check_draft_ids(drafts: list[int] | None, *, vocab_size: int, max_draft_len: int) -> None:
    if not drafts:
        return
    if len(drafts) > max_draft_len:
        raise RequestInputError(f"draft_input_ids has {len(drafts)} tokens; max_draft_len is {max_draft_len}",
                                fix=f"send at most {max_draft_len} draft tokens")
    bad = [t for t in drafts if not 0 <= t < vocab_size]
    if bad:
        raise RequestInputError(f"draft_input_ids out of the vocabulary [0, {vocab_size}): {bad[:5]}",
                                fix="send token ids of this model's tokenizer")
