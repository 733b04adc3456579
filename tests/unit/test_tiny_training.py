"""The tiny pair's training schedule (trtspec.checkpoints.tiny._train_pair) on a toy-sized pair: the
draft joins at ``draft_joins_at`` and is taught by the target's own training forwards until the
target's last step, then by one teacher forward per step of its own."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from trtspec.checkpoints.tiny import Arch, TinySettings, _init, _model_args, _train_pair
from trtspec.speculative.model import CausalLM

TOY = TinySettings(vocab_size=64, seq_len=8, batch_size=2, target=Arch(32, 1, 2, 1, 64), draft=Arch(16, 1, 2, 1, 32),
                   target_steps=6, draft_steps=5, draft_joins_at=3, precision="fp32")


def _run(settings: TinySettings):
    torch.manual_seed(0)
    target = CausalLM(_model_args(settings.target, settings, 0))
    draft = CausalLM(_model_args(settings.draft, settings, 0))
    _init(target, 0)
    _init(draft, 1)
    calls: list[tuple[str, int]] = []
    target_forwards = []
    target.register_forward_hook(lambda *a: target_forwards.append(torch.is_grad_enabled()))
    gen = torch.Generator().manual_seed(0)

    def batches():
        return torch.randint(0, settings.vocab_size, (settings.batch_size, settings.seq_len + 1), generator=gen)

    t_s, d_s = _train_pair(target, draft, settings, batches, lambda phase, step, total, m: calls.append((phase, step)))
    return calls, target_forwards, t_s, d_s, target, draft


def test_the_draft_joins_at_its_step_and_shares_the_targets_forwards():
    calls, forwards, t_s, d_s, target, draft = _run(TOY)
    # target steps 1..3 alone, then target and draft step by step, then the draft alone
    assert calls == [("target", 1), ("target", 2), ("target", 3), ("target", 4), ("draft", 1), ("target", 5),
                     ("draft", 2), ("target", 6), ("draft", 3), ("draft", 4), ("draft", 5)]
    # 6 training forwards of the target (with grad), then one teacher forward (no grad) for each of
    # the draft's 2 steps alone: the 3 shared steps cost no target forward of their own
    assert forwards == [True] * 6 + [False] * 2
    assert t_s > 0 and d_s > 0
    assert not target.training and not draft.training
    assert not any(p.requires_grad for p in target.parameters())


@pytest.mark.parametrize("join, expected_forwards", [(6, [True] * 6 + [False] * 5), (0, [True] * 6)])
def test_joining_at_the_end_distils_only_the_finished_target_and_at_zero_shares_every_step(join, expected_forwards):
    calls, forwards, *_ = _run(replace(TOY, draft_joins_at=join))
    assert forwards == expected_forwards  # joined at 0, the draft's 5 steps all ride on the target's 6
    assert [c for c in calls if c[0] == "draft"] == [("draft", i) for i in range(1, 6)]


def test_the_schedule_is_part_of_the_cache_key_and_checked():
    assert replace(TOY, draft_joins_at=4).key() != TOY.key()
    for bad in (-1, 7):
        with pytest.raises(ValueError, match=f"draft_joins_at: {bad} is not a target step; use 0 to target_steps \\(6"):
            replace(TOY, draft_joins_at=bad)
