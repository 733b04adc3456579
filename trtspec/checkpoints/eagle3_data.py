"""The EAGLE-3 head's training data at real scale: the target's features, extracted once, on disk.

A Qwen-size target cannot run inside every training step on 2 CPU cores (a 1.5B forward reads
~100 tokens/s), so the teacher pass runs once over a fixed set of corpus windows and writes, per
token, what the head learns from:

* ``feats``   the target's low/mid/high decoder-layer outputs, concatenated ``[T, n*H]`` (bf16);
* ``top_ids`` / ``top_logits``  the target's ``topk`` most likely next tokens and their logits
  (the label; the tail beyond the top 32 carries a negligible share of the probability and
  none of the greedy decisions acceptance pays on).

The text is the stdlib corpus (``data="corpus"``) or the target's own greedy continuations of
code prompts cut from the corpus's train split (``data="continuations"``, self-distillation: the
head then learns from exactly the text it will draft at serving time, where every next token is
the target's own choice). The continuations are generated once, in resumable shards, then read
like the corpus.

Shards of ``windows_per_shard`` windows are written atomically (``shard_00012.safetensors``), so
an interrupted extraction resumes at the first missing shard; the folder is keyed by the target's
content hash, the layers and these settings (``~/.cache/trtspec/eagle3_features/<key>/``).
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from trtspec.corpus import code_request_prompts
from trtspec.errors import ModelError
from trtspec.manifest import hash_json
from trtspec.sampling import Sampling
from trtspec.speculative.engine import Engine

Progress = Callable[[str, int, int, dict], None]


@dataclass(frozen=True)
class FeatureSettings:
    tokens: int = 262144  # 1,024 windows of 256: ~42 minutes of a 1.5B bf16 target on 2 cores
    seq_len: int = 256
    windows_per_shard: int = 8
    topk: int = 32
    seed: int = 0

    @property
    def windows(self) -> int:
        return max(self.tokens // self.seq_len, 1)

    @property
    def shards(self) -> int:
        return -(-self.windows // self.windows_per_shard)


@dataclass(frozen=True)
class ContinuationSettings:
    """The self-distillation text: greedy continuations of ``code_request_prompts`` (train split)."""

    new_tokens: int = 160  # per prompt; generation stops earlier at the target's EOS
    batch_size: int = 16  # prompts per generated shard (one engine batch)
    min_chars: int = 80
    max_chars: int = 600
    seed: int = 0


def cache_root() -> pathlib.Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(root) / "trtspec" / "eagle3_features"


def feature_dir(target_id: str, aux_layers: tuple[int, ...], dtype: torch.dtype, fs: FeatureSettings,
                cs: ContinuationSettings | None = None) -> pathlib.Path:
    extra = {} if cs is None else {"continuations": asdict(cs)}  # corpus keys stay what they were
    key = hash_json({"target": target_id, "aux": list(aux_layers), "dtype": str(dtype),
                     **{k: v for k, v in asdict(fs).items() if k != "tokens"}, **extra})[:16]
    return cache_root() / key  # tokens is not in the key: a larger budget extends the same windows


def window_starts(n_tokens: int, fs: FeatureSettings) -> list[int]:
    """Non-overlapping window starts over the train split, in a seeded order; the first ``n``
    of the order are the same for any budget, so a larger budget only adds shards."""
    slots = (n_tokens - 1) // fs.seq_len
    if slots < 1:
        raise ValueError(f"the corpus has {n_tokens} tokens, fewer than one window of {fs.seq_len}")
    order = torch.randperm(slots, generator=torch.Generator().manual_seed(fs.seed)).tolist()
    return [i * fs.seq_len for i in order[: fs.windows]]


@torch.inference_mode()
def generate_continuations(target, tokenizer, train_texts: list[str], folder: pathlib.Path, need_tokens: int,
                           cs: ContinuationSettings, *, progress: Progress | None = None) -> torch.Tensor:
    """A token stream of at least ``need_tokens``: prompt, the target's greedy continuation, EOS,
    prompt, … Generated in shards of ``cs.batch_size`` prompts (``gen_00003.safetensors``, written
    atomically, so an interrupted run resumes at the first missing shard; a larger need adds shards)."""
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True, exist_ok=True)
    eos = target.args.eos_token_id
    # all prompts are cut once, in a seeded order: shard i is always prompts[i*B:(i+1)*B]
    prompts: list[str] | None = None
    engine = None
    parts: list[torch.Tensor] = []
    have, i, t0, made = 0, 0, time.perf_counter(), 0
    while have < need_tokens:
        path = folder / f"gen_{i:05d}.safetensors"
        if not path.is_file():
            if prompts is None:
                prompts = code_request_prompts(train_texts, 100_000, seed=cs.seed, min_chars=cs.min_chars,
                                               max_chars=cs.max_chars)
            chunk = prompts[i * cs.batch_size : (i + 1) * cs.batch_size]
            if not chunk:
                raise ModelError(f"feature_tokens: the corpus gives {len(prompts)} code prompts, too few for "
                                 f"{need_tokens} tokens of continuations", fix="lower --feature-tokens, or use --data corpus")
            ids = [enc.ids for enc in tokenizer.backend_tokenizer.encode_batch(chunk, add_special_tokens=False)]
            longest = max(len(x) for x in ids) + cs.new_tokens + 8
            if engine is None or engine.max_seq_len < longest:  # a longer batch than any before: a larger cache
                engine = Engine(target, None, max_batch_size=cs.batch_size, max_seq_len=max(longest, 1024))
            gens = engine.generate(ids, Sampling(max_tokens=cs.new_tokens))
            stream: list[int] = []
            for p, g in zip(ids, gens):
                out = list(g.token_ids)
                stream += p + out + ([] if out and out[-1] == eos else [eos])
            part = torch.tensor(stream, dtype=torch.int32)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            save_file({"ids": part}, str(tmp))
            os.replace(tmp, path)
            made += 1
        else:
            part = load_file(str(path))["ids"]
        part = part.long()
        parts.append(part)
        have += part.numel()
        i += 1
        if progress and made:
            el = time.perf_counter() - t0
            rate = made * cs.batch_size / el  # prompts/s this run
            left = max(need_tokens - have, 0) / max(have / i, 1) * cs.batch_size
            progress("continuations", min(have, need_tokens), need_tokens,
                     {"prompts_s": rate, "eta_s": left / rate if rate else 0.0})
    return torch.cat(parts)


@torch.inference_mode()
def extract_features(target, train_ids: torch.Tensor, aux_layers: tuple[int, ...], folder: pathlib.Path,
                     fs: FeatureSettings, *, target_id: str, progress: Progress | None = None) -> pathlib.Path:
    """Write the missing shards of ``folder`` (resumable); returns the folder."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    meta = {"target": target_id, "aux_layers": list(aux_layers), "settings": asdict(fs),
            "format": "per window: ids [T] int32, feats [T, n*H] bf16, top_ids [T, k] int32, top_logits [T, k] bf16"}
    (folder / "features.json").write_text(json.dumps(meta, indent=2) + "\n")
    starts = window_starts(train_ids.numel(), fs)
    todo = [i for i in range(fs.shards) if not (folder / f"shard_{i:05d}.safetensors").is_file()]
    t0, done = time.perf_counter(), 0
    for i in todo:
        chunk = starts[i * fs.windows_per_shard : (i + 1) * fs.windows_per_shard]
        x = torch.stack([train_ids[s : s + fs.seq_len] for s in chunk])
        logits, hidden, _ = target(x, None, hidden_layers=aux_layers)
        top = logits.float().topk(fs.topk, dim=-1)
        tensors = {"ids": x.to(torch.int32).contiguous(),
                   "feats": torch.cat(hidden, -1).to(torch.bfloat16).contiguous(),
                   "top_ids": top.indices.to(torch.int32).contiguous(),
                   "top_logits": top.values.to(torch.bfloat16).contiguous()}
        path = folder / f"shard_{i:05d}.safetensors"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        save_file(tensors, str(tmp))
        os.replace(tmp, path)  # a shard is there whole or not at all: an interrupted run resumes here
        done += 1
        if progress:
            el = time.perf_counter() - t0
            progress("features", fs.shards - len(todo) + done, fs.shards,
                     {"tok_s": done * len(chunk) * fs.seq_len / el, "eta_s": el / done * (len(todo) - done)})
    return folder


@dataclass
class FeatureSet:
    ids: torch.Tensor  # [N, T] long
    feats: torch.Tensor  # [N, T, n*H] bf16
    top_ids: torch.Tensor  # [N, T, k] long
    top_logits: torch.Tensor  # [N, T, k] float

    @property
    def windows(self) -> int:
        return self.ids.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.ids, self.feats, self.top_ids, self.top_logits))


def load_features(folder: pathlib.Path, fs: FeatureSettings) -> FeatureSet:
    from safetensors.torch import load_file

    parts = [load_file(str(folder / f"shard_{i:05d}.safetensors")) for i in range(fs.shards)]
    cat = lambda k: torch.cat([p[k] for p in parts])  # noqa: E731
    n = fs.windows
    return FeatureSet(cat("ids")[:n].long(), cat("feats")[:n], cat("top_ids")[:n].long(), cat("top_logits")[:n].float())
