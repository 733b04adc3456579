"""A draft vocabulary: the ``size`` most frequent target tokens, the only ones a draft proposes.

The draft's LM head is the largest single matrix it reads per token (the Qwen2.5-Coder 0.5B
draft's is 136 M of its 494 M parameters); cut to the tokens that code and prose actually use, it
costs a fraction (FR-Spec, Zhao et al. 2025; EAGLE-3's draft vocabulary). Lossless: the target still
verifies every token; a token outside the cut is simply never proposed, so it is rejected where
the target wants it and the target's own (bonus or corrected) token takes its place.

The map is written the way EAGLE-3 checkpoints (SpecForge, ModelOpt, TRT-LLM's PyTorch flow) carry
it: ``d2t[i]`` is the *offset* from draft index ``i`` to its target id (target = i + d2t[i]) and
``t2d`` is a boolean mask over the target vocabulary. Frequencies are counted over trtspec's local
corpus (the standard library's sources, :mod:`trtspec.corpus`, train split) with the model's own
tokenizer, and cached per tokenizer, size and corpus.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections import Counter
from dataclasses import dataclass

import torch

from trtspec.corpus import corpus_split
from trtspec.errors import ModelError

_CACHE_VERSION = 1


@dataclass(frozen=True)
class DraftVocab:
    ids: torch.Tensor  # [size] target ids, by draft index (ascending id)
    vocab_size: int  # the target vocabulary the ids index
    coverage: float  # share of the held-out corpus's tokens inside the cut

    @property
    def size(self) -> int:
        return int(self.ids.numel())

    def d2t(self) -> torch.Tensor:
        """EAGLE-3's draft-to-target offsets: target id = draft index + d2t[draft index]."""
        return self.ids - torch.arange(self.size, dtype=self.ids.dtype)

    def t2d(self) -> torch.Tensor:
        """EAGLE-3's target-to-draft mask: True where the target token is in the draft vocabulary."""
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self.ids] = True
        return mask

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, vocab_size: int) -> "DraftVocab":
        ids = d2t.long() + torch.arange(d2t.numel())
        return cls(ids, vocab_size, float("nan"))


def _cache_dir() -> pathlib.Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(root) / "trtspec" / "draft_vocab"


def _special_ids(tok, cfg: dict) -> set[int]:
    """Special tokens a reply ends or is structured with (EOS, chat markers): always in the cut."""
    ids = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    for key in ("eos_token_id", "bos_token_id"):
        v = cfg.get(key)
        ids.update(v if isinstance(v, list) else [v] if isinstance(v, int) else [])
    return ids


def frequent_vocab(model_dir: str | os.PathLike, size: int, vocab_size: int, *, cfg: dict | None = None) -> DraftVocab:
    """The ``size`` most frequent tokens of the corpus under ``model_dir``'s tokenizer (special
    tokens first, then by count, ties by id; ids no text uses fill up in id order), cached."""
    from tokenizers import Tokenizer  # the client extra's; torch-runtime users have it via transformers

    folder = pathlib.Path(model_dir)
    tok_file = folder / "tokenizer.json"
    if not tok_file.is_file():
        raise ModelError(f"speculation.draft_vocab_size: {folder} has no tokenizer.json to count tokens with",
                         fix="put the model's fast tokenizer (tokenizer.json) in its folder, or drop draft_vocab_size")
    if not 0 < size <= vocab_size:
        raise ModelError(f"speculation.draft_vocab_size: {size} is not in 1..{vocab_size} (the model's vocabulary)",
                         fix=f"set it below {vocab_size}, or drop it to draft over the whole vocabulary")
    train, held = corpus_split()
    key = hashlib.sha256(tok_file.read_bytes())
    key.update(json.dumps([_CACHE_VERSION, size, vocab_size, len(train), sum(map(len, train))]).encode())
    path = _cache_dir() / f"{key.hexdigest()[:24]}.json"
    if path.is_file():
        d = json.loads(path.read_text())
        return DraftVocab(torch.tensor(d["ids"], dtype=torch.long), vocab_size, d["coverage"])

    tok = Tokenizer.from_file(str(tok_file))
    counts: Counter[int] = Counter()
    for enc in tok.encode_batch(train, add_special_tokens=False):
        counts.update(enc.ids)
    special = sorted(i for i in _special_ids(tok, cfg or {}) if 0 <= i < vocab_size)
    ranked = special + [i for i, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
                        if i < vocab_size and i not in set(special)]
    chosen = set(ranked[:size])
    for i in range(vocab_size):  # fill with the lowest unused ids (byte tokens, in BPE vocabularies)
        if len(chosen) >= size:
            break
        chosen.add(i)
    ids = torch.tensor(sorted(chosen), dtype=torch.long)
    held_counts: Counter[int] = Counter()
    for enc in tok.encode_batch(held, add_special_tokens=False):
        held_counts.update(enc.ids)
    total = sum(held_counts.values())
    coverage = sum(c for i, c in held_counts.items() if i in chosen) / max(total, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"ids": ids.tolist(), "coverage": coverage, "size": size, "vocab_size": vocab_size}))
    os.replace(tmp, path)
    return DraftVocab(ids, vocab_size, coverage)
