"""Train an EAGLE-3 head for a target (the tiny target by default) and export it.

Native trainer (default): the target runs teacher-forced over windows of the stdlib corpus and
gives, per position, its low/mid/high layer outputs (the head's features) and its next-token
distribution (the head's label: soft cross-entropy = KL to the target up to a constant, which
is what acceptance pays on). Then ``ttt_steps`` extra *training-time test* steps (EAGLE-3 §3.3)
feed the head its own output as the feature, with the attention mask the runtime will see, so
the head learns to draft 2, 3, … tokens ahead rather than only one.

ModelOpt trainer (``trainer="modelopt"``): ``modelopt.torch.speculative`` converts the HF target
to an EAGLE model and trains the head with its own loss and TTT; its
``export_speculative_decoding`` writes the head folder. ModelOpt 0.47 normalises the feature
differently from TRT-LLM (see ``trtspec.speculative.eagle3``); the manifest records it.

Both write the same layout (``LlamaForCausalLMEagle3``, ``fc``/``layers.0.*``/``norm``/
``lm_head``) plus ``trtspec.json``; deterministic for a seed on one machine; cached by settings
and the target's identity.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import pathlib
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

import torch

from trtspec.errors import ModelError
from trtspec.manifest import atomic_dir, hash_folder, hash_json, maybe_manifest, write_manifest
from trtspec.model_makers import missing_model_fix
from trtspec.speculative.eagle3 import Eagle3Head, HeadConfig, default_aux_layers, load_eagle3_head, save_head
from trtspec.speculative.model import CausalLM, count_params, load_causal_lm, read_hf_config
from trtspec.checkpoints.tiny import cpu_has_native_bf16, encode_corpus
from trtspec.checkpoints.eagle3_data import (ContinuationSettings, FeatureSettings, extract_features, feature_dir,
                                             generate_continuations, load_features)
from trtspec.corpus import corpus_split
from trtspec.speculative.eagle3 import Eagle3Proposer
from trtspec.speculative.engine import Engine
from trtspec.speculative.stats import Aggregate
from trtspec.speculative.vocab import frequent_vocab
from trtspec.sampling import Sampling

TRAINERS = ("native", "modelopt")
DATA = ("corpus", "continuations")
Progress = Callable[[str, int, int, dict], None]  # (phase, step, total, metrics)


@dataclass(frozen=True)
class Eagle3Settings:
    seed: int = 0
    trainer: str = "native"
    steps: int = 200  # ≈ 2 minutes on 2 quiet cores (0.6 s/step); acceptance still rises with more
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 3e-3
    ttt_steps: int = 2  # extra training-time-test steps after the teacher-forced one
    loss_decay: float = 0.8  # weight of TTT step s is decay**s (ModelOpt's default)
    aux_layers: tuple[int, ...] | None = None  # None = default_aux_layers(target layers)
    intermediate_size: int | None = None  # None = the target's
    threads: int = 2
    heldout_every: int = 16  # same held-out split as the tiny pair
    eval_prompts: int = 24
    eval_new_tokens: int = 48
    max_draft_len: int = 4
    # real scale (a target too large to run inside every step): the teacher pass runs once over
    # feature_tokens corpus tokens, cached on disk (trtspec.checkpoints.eagle3_data), and the head
    # trains on those features in bf16 autocast. None: the target runs in each step (tiny targets).
    feature_tokens: int | None = None
    draft_vocab_size: int | None = None  # EAGLE-3's reduced vocabulary (d2t/t2d); None = the target's
    # real scale: the text features are extracted over. "corpus": stdlib windows; "continuations":
    # the target's own greedy continuations of code prompts from the train split (self-distillation)
    data: str = "corpus"
    target_dtype: str = "float32"

    REAL_SCALE_PARAMS = 200_000_000  # targets above this train from extracted features by default

    @classmethod
    def real_scale(cls, trainer: str = "native", **overrides) -> "Eagle3Settings":
        """The preset for a billion-parameter target on 2 cores: ~42 min of feature extraction
        (262,144 tokens at ~105 tokens/s for a 1.5B target) and ~35 min of training (320 steps of
        4 x 256 tokens, ~6.5 s each: 1.25 passes over the data; 131,072 tokens seen 3 times gave a head
        still memorising, stop 38), a 32,768-token draft vocabulary."""
        base = dict(trainer=trainer, steps=320, batch_size=4, seq_len=256, lr=1e-3, feature_tokens=262144,
                    draft_vocab_size=32768, target_dtype=fast_cpu_dtype(), eval_prompts=8, eval_new_tokens=48,
                    max_draft_len=3)
        return cls(**{**base, **{k: v for k, v in overrides.items() if v is not None}})

    @classmethod
    def for_trainer(cls, trainer: str = "native", **overrides) -> "Eagle3Settings":
        """Defaults per trainer; ``None`` overrides keep the default. ModelOpt's CPU step is
        several times slower (reference/modelopt-cpu.md §4), so its default budget is fewer steps."""
        steps = {"native": cls.steps, "modelopt": 60}.get(trainer, cls.steps)
        kw = {"trainer": trainer, "steps": steps, **{k: v for k, v in overrides.items() if v is not None}}
        return cls(**kw)

    def key(self, target_id: str) -> str:
        return hash_json({**asdict(self), "target": target_id})[:16]


def fast_cpu_dtype() -> str:
    """The real-scale trainer's compute dtype: bfloat16 where the CPU has bf16 dot products
    (AVX512-BF16 or AMX), else float32: without them torch converts every bf16 matmul, and a 1.5B
    target reads ~19 tokens/s in bf16 against ~85 in fp32 (2-core Xeon without avx512_bf16)."""
    return "bfloat16" if cpu_has_native_bf16() else "float32"


def target_params(target_dir: str | os.PathLike) -> int:
    """Parameters in a checkpoint folder's safetensors (headers only: no weights read)."""
    from safetensors import safe_open

    n = 0
    for f in sorted(pathlib.Path(target_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():
                n += math.prod(fh.get_slice(k).get_shape())
    return n


def eagle3_settings(target_dir: str | os.PathLike, scale: str = "auto", *, trainer: str = "native",
                    **overrides) -> Eagle3Settings:
    """Settings for ``trtspec models eagle3``: the tiny preset (the target in every step) or the
    real-scale one (extracted features, a draft vocabulary), ``auto`` by the target's size."""
    if scale not in ("auto", "tiny", "real"):
        raise ModelError(f"scale {scale!r} is not known", fix="use auto, tiny or real")
    if scale == "auto":
        if not (pathlib.Path(target_dir) / "config.json").is_file():
            raise ModelError(f"target model folder not found or has no config.json: {target_dir}",
                             fix=missing_model_fix(str(target_dir)))
        scale = "real" if target_params(target_dir) > Eagle3Settings.REAL_SCALE_PARAMS else "tiny"
    if scale == "real":
        return Eagle3Settings.real_scale(trainer, **overrides)
    if overrides.get("data") not in (None, "corpus"):
        raise ModelError(f"--data {overrides['data']}: the target's continuations are the real-scale trainer's",
                         fix="add --scale real (or leave the option out)")
    overrides.pop("data", None)
    for name in ("feature_tokens", "draft_vocab_size"):
        if overrides.get(name) is not None:
            raise ModelError(f"--{name.replace('_', '-')} {overrides[name]}: extracted features and a draft vocabulary "
                             "are the real-scale trainer's", fix="add --scale real (or leave the option out)")
    return Eagle3Settings.for_trainer(trainer, **{k: v for k, v in overrides.items()
                                                  if k not in ("feature_tokens", "draft_vocab_size")})


@dataclass
class Eagle3Result:
    head_dir: pathlib.Path
    trainer: str
    params: int
    train_s: float
    acceptance_length: float
    acceptance_rate: float
    step_accuracy: list[float]
    cached: bool = False


# --------------------------------------------------------------------------------------------
# data: the corpus the target was trained on, in its own tokenizer


def corpus_ids(target_dir: pathlib.Path, heldout_every: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) token ids of the stdlib corpus in the target's tokenizer."""
    tok_file = pathlib.Path(target_dir) / "tokenizer.json"
    stamp = tok_file.stat().st_mtime_ns if tok_file.is_file() else 0
    return _corpus_ids(str(pathlib.Path(target_dir).resolve()), heldout_every, stamp)


@functools.lru_cache(maxsize=2)  # tokenizing the stdlib takes seconds; a process may train twice
def _corpus_ids(target_dir: str, heldout_every: int, _tokenizer_stamp: int) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers import AutoTokenizer


    tok = AutoTokenizer.from_pretrained(target_dir)
    train, held = corpus_split(heldout_every)
    return encode_corpus(tok, train), encode_corpus(tok, held)


def _windows(data: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - length - 1, (n,), generator=gen)
    return torch.stack([data[s : s + length] for s in starts.tolist()])


def head_config_for(target: CausalLM, settings: Eagle3Settings, feature_norm: str = "standard") -> HeadConfig:
    t = target.args
    aux = settings.aux_layers or default_aux_layers(t.num_hidden_layers)
    if any(not 0 <= i < t.num_hidden_layers for i in aux):
        raise ModelError(f"aux_layers {list(aux)}: the target has layers 0..{t.num_hidden_layers - 1}",
                         fix="pick layer indices of the target (decoder-layer outputs)")
    layer = replace(t, num_hidden_layers=1, intermediate_size=settings.intermediate_size or t.intermediate_size,
                    tie_word_embeddings=False, attention_bias=False)
    cut = settings.draft_vocab_size is not None and settings.draft_vocab_size < t.vocab_size
    return HeadConfig(layer, tuple(aux), feature_norm, settings.draft_vocab_size if cut else None)


def init_head(head: Eagle3Head, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            else:
                p.fill_(1.0)  # RMSNorm weights


# --------------------------------------------------------------------------------------------
# native training


def ttt_loss(head: Eagle3Head, target: CausalLM, x: torch.Tensor, ttt_steps: int, decay: float):
    """Loss and per-step top-1 accuracy vs the target for token windows ``x [B, T]``."""
    with torch.no_grad():
        logits, hidden, _ = target(x, None, hidden_layers=head.aux_layers)
        p = logits.float().softmax(-1)  # [B, T, V] target's next-token distributions
        best = logits.argmax(-1)  # [B, T]
        feats = torch.cat(hidden, -1)  # [B, T, n*H]
    ids = x.roll(-1, 1)  # position j pairs feature j with token j+1 (last column unused)
    feature = head.fc(feats)
    past: list = []
    total, accs = 0.0, []
    for s in range(ttt_steps + 1):
        g, kv = head.ttt_forward(feature, ids, past)
        past.append(kv)
        # head at position j predicts x_{j+2}: label = target distribution at j+1; rows j < s
        # have no anchor at this step, and j = T-1 has no label
        lg = head.logits(g[:, s:-1]).float()
        loss = -(p[:, s + 1 :] * lg.log_softmax(-1)).sum(-1).mean()
        total = total + decay**s * loss
        accs.append(float((lg.argmax(-1) == best[:, s + 1 :]).float().mean()))
        feature = torch.cat([torch.zeros_like(g[:, :1]), g[:, :-1]], 1)  # own output → next position
    return total, accs


def _lr(step: int, total: int, peak: float) -> float:
    warm = max(total // 20, 5)
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(total - warm, 1)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train_native(target: CausalLM, settings: Eagle3Settings, train_ids: torch.Tensor,
                 progress: Progress | None = None) -> tuple[Eagle3Head, float]:
    cfg = head_config_for(target, settings)
    head = Eagle3Head(cfg, target.model.embed_tokens, target.lm_head)
    init_head(head, settings.seed)
    opt = torch.optim.AdamW(head.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(settings.seed + 1)
    head.train()
    t0 = time.perf_counter()
    for step in range(settings.steps):
        for grp in opt.param_groups:
            grp["lr"] = _lr(step, settings.steps, settings.lr)
        x = _windows(train_ids, settings.batch_size, settings.seq_len, gen)
        loss, accs = ttt_loss(head, target, x, settings.ttt_steps, settings.loss_decay)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if progress:
            progress("eagle3", step + 1, settings.steps, {"loss": float(loss.detach()), "acc": accs})
    head.eval()
    return head, time.perf_counter() - t0


# --------------------------------------------------------------------------------------------
# native training from extracted features (real scale)


def draft_index(head: Eagle3Head) -> torch.Tensor | None:
    """Target id → draft index (-1 outside the draft vocabulary); None without a cut."""
    if not head.cfg.vocab_cut:
        return None
    idx = torch.full((head.args.vocab_size,), -1, dtype=torch.long)
    ids = head.to_target(torch.arange(head.cfg.draft_vocab_size, device=head.d2t.device)).cpu()
    idx[ids] = torch.arange(ids.numel())
    return idx


def ttt_loss_topk(head: Eagle3Head, feats: torch.Tensor, x: torch.Tensor, top_ids: torch.Tensor,
                  top_logits: torch.Tensor, to_draft: torch.Tensor | None, ttt_steps: int, decay: float):
    """:func:`ttt_loss` with the target's label as its top-k next tokens (extracted features).

    ``feats [B, T, n*H]`` target layer outputs, ``x [B, T]`` the window's tokens, ``top_ids`` /
    ``top_logits [B, T, k]`` the target's most likely next tokens at each position. With a draft
    vocabulary the label is the target's distribution restricted to it and renormalised, and a
    position whose top-k has no kept token carries no loss (EAGLE-3's position mask).
    """
    p = top_logits.float().softmax(-1)  # [B, T, k]
    idx = top_ids if to_draft is None else to_draft[top_ids]
    inside = idx >= 0
    p = p * inside
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
    idx = idx.clamp_min(0)
    ids = x.roll(-1, 1)
    feature = head.fc(feats.to(head.fc.weight.dtype))
    past: list = []
    total, accs = 0.0, []
    for s in range(ttt_steps + 1):
        g, kv = head.ttt_forward(feature, ids, past)
        past.append(kv)
        lg = head.logits(g[:, s:-1]).float().log_softmax(-1)  # [B, T-1-s, Vd]
        m = inside[:, s + 1 :].any(-1).float()
        nll = -(p[:, s + 1 :] * lg.gather(-1, idx[:, s + 1 :])).sum(-1)
        total = total + decay**s * (nll * m).sum() / m.sum().clamp_min(1.0)
        hit = (lg.argmax(-1) == idx[:, s + 1 :, 0]) & inside[:, s + 1 :, 0]  # the target's greedy token
        accs.append(float(hit.float().sum() / inside[:, s + 1 :, 0].float().sum().clamp_min(1.0)))
        feature = torch.cat([torch.zeros_like(g[:, :1]), g[:, :-1]], 1)
    return total, accs


def train_from_features(target: CausalLM, settings: Eagle3Settings, data, vocab,
                        progress: Progress | None = None) -> tuple[Eagle3Head, float]:
    """Train on a :class:`~trtspec.checkpoints.eagle3_data.FeatureSet` (fp32 weights; bf16 autocast
    when ``target_dtype`` is bfloat16, i.e. the CPU has bf16 dot products: they run ~3x fp32's on
    Zen 4); ``vocab`` a DraftVocab or None."""
    cfg = head_config_for(target, settings)
    head = Eagle3Head(cfg, target.model.embed_tokens, target.lm_head).float()
    init_head(head, settings.seed)
    if vocab is not None:
        head.set_vocab_(vocab.ids)
    to_draft = draft_index(head)
    opt = torch.optim.AdamW([q for q in head.parameters() if q.requires_grad], lr=settings.lr,
                            betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(settings.seed + 1)
    head.train()
    t0 = time.perf_counter()
    order = torch.randperm(data.windows, generator=gen)
    for step in range(settings.steps):
        for grp in opt.param_groups:
            grp["lr"] = _lr(step, settings.steps, settings.lr)
        pick = order[(torch.arange(settings.batch_size) + step * settings.batch_size) % data.windows]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.target_dtype == "bfloat16"):
            loss, accs = ttt_loss_topk(head, data.feats[pick].float(), data.ids[pick], data.top_ids[pick],
                                       data.top_logits[pick], to_draft, settings.ttt_steps, settings.loss_decay)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if progress:
            el = time.perf_counter() - t0
            progress("eagle3", step + 1, settings.steps,
                     {"loss": float(loss.detach()), "acc": accs, "eta_s": el / (step + 1) * (settings.steps - step - 1)})
    head.eval()
    return head, time.perf_counter() - t0


# --------------------------------------------------------------------------------------------
# ModelOpt training


def train_modelopt(target_dir: pathlib.Path, target: CausalLM, settings: Eagle3Settings, train_ids: torch.Tensor,
                   out: pathlib.Path, progress: Progress | None = None) -> float:
    """Train with ``modelopt.torch.speculative`` and export into ``out`` (config + safetensors)."""
    import modelopt.torch.speculative as mtsp
    from modelopt.torch.export import export_speculative_decoding
    from transformers import AutoModelForCausalLM

    cfg = head_config_for(target, settings)
    a = cfg.layer
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    ec = copy.deepcopy(mtsp.EAGLE3_DEFAULT_CFG["config"])
    missing = [k for k in ("eagle_ttt_steps", "eagle_export_rope_scaling") if k not in mtsp.config.EagleConfig.model_fields]
    if missing:
        import modelopt

        raise ModelError(f"--trainer modelopt needs ModelOpt's EAGLE-3 options {missing}, which ModelOpt "
                         f"{modelopt.__version__} does not have", fix="use --trainer native, or nvidia-modelopt 0.47")
    ec["eagle_use_torch_compile"] = False  # compiles for minutes on CPU before the first step
    ec["eagle_export_rope_scaling"] = {}  # else the export claims yarn x32 that training never used
    ec["eagle_ttt_steps"] = settings.ttt_steps + 1
    ec["eagle_loss_decay_factor"] = settings.loss_decay
    ec["eagle_architecture_config"] = {
        **ec.get("eagle_architecture_config", {}),
        "intermediate_size": a.intermediate_size, "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads, "head_dim": a.head_dim,
        "rms_norm_eps": a.rms_norm_eps, "rope_theta": a.rope_theta,
        "rope_scaling": {"rope_type": "default", "rope_theta": a.rope_theta},
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layers),
    }
    torch.manual_seed(settings.seed)
    mtsp.convert(model, [("eagle", ec)])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(settings.seed + 1)
    model.train()
    t0 = time.perf_counter()
    for step in range(settings.steps):
        for grp in opt.param_groups:
            grp["lr"] = _lr(step, settings.steps, settings.lr)
        x = _windows(train_ids, settings.batch_size, settings.seq_len, gen)
        res = model(input_ids=x)
        res.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if progress:
            progress("eagle3-modelopt", step + 1, settings.steps,
                     {"loss": float(res.loss.detach()), "acc": list(res.train_acc[0])})
    train_s = time.perf_counter() - t0
    model.eval()
    with torch.inference_mode():
        export_speculative_decoding(model, export_dir=str(out))
    return train_s


# --------------------------------------------------------------------------------------------
# evaluation


@torch.inference_mode()
def step_accuracy(head: Eagle3Head, target: CausalLM, windows: torch.Tensor, ttt_steps: int) -> list[float]:
    """Teacher-forced top-1 agreement with the target at draft steps 1..ttt_steps+1 (for a cut
    head: among positions whose target token is inside its vocabulary)."""
    if head.cfg.vocab_cut:
        accs: list[list[float]] = []
        bf16 = target.model.embed_tokens.weight.dtype == torch.bfloat16
        for w in windows.split(2):  # a 1.5B target: two windows at a time
            logits, hidden, _ = target(w, None, hidden_layers=head.aux_layers)
            top = logits.float().topk(32, -1)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=w.device.type == "cpu" and bf16):
                accs.append(ttt_loss_topk(head, torch.cat(hidden, -1), w, top.indices, top.values, draft_index(head),
                                          ttt_steps, 1.0)[1])
        return [round(sum(a) / len(a), 4) for a in zip(*accs)]
    _, accs = ttt_loss(head, target, windows, ttt_steps, 1.0)
    return [round(a, 4) for a in accs]


def eval_prompts(held_ids: torch.Tensor, n: int) -> list[list[int]]:
    """``n`` held-out prompts of mixed length (16..112 tokens), evenly spread over the text."""
    stride = max((held_ids.numel() - 200) // n, 1)
    return [held_ids[i * stride : i * stride + 16 + (i * 37) % 97].tolist() for i in range(n)]


@torch.inference_mode()
def measure_acceptance(target: CausalLM, head: Eagle3Head, prompts: list[list[int]], *, max_new_tokens: int,
                       max_draft_len: int) -> dict:
    """Greedy generation with the head through the engine; acceptance over all prompts."""

    max_seq = max(len(p) for p in prompts) + max_new_tokens + 8
    prop = Eagle3Proposer(head, 8, max_seq + max_draft_len + 2)
    eng = Engine(target, prop, max_draft_len=max_draft_len, max_batch_size=8, max_seq_len=max_seq)
    gens = eng.generate(prompts, Sampling(max_tokens=max_new_tokens, ignore_eos=True))
    agg = Aggregate()
    for g in gens:
        agg.add(g.stats)
    drafted = sum(g.stats.drafted for g in gens)
    accepted = sum(g.stats.accepted for g in gens)
    steps = sum(g.stats.steps for g in gens)
    return {
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "max_draft_len": max_draft_len,
        "drafted": drafted,
        "accepted": accepted,
        "target_passes": steps,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
        "acceptance_length": round((accepted + steps) / steps, 4) if steps else 0.0,
        "per_position_acceptance": [round(x, 4) for x in agg.per_position_acceptance()],
    }


# --------------------------------------------------------------------------------------------
# the command


def _train_real_scale(tdir: pathlib.Path, target: CausalLM, target_id: str, settings: Eagle3Settings,
                      train_ids: torch.Tensor, progress: Progress | None):
    """Extract (or reuse) the target's features, count the draft vocabulary, train on the features."""

    cfg = head_config_for(target, settings)
    fs = FeatureSettings(tokens=settings.feature_tokens, seq_len=settings.seq_len, seed=settings.seed)
    cs = ContinuationSettings(seed=settings.seed) if settings.data == "continuations" else None
    folder = feature_dir(target_id, cfg.aux_layers, target.model.embed_tokens.weight.dtype, fs, cs)
    gen_s = 0.0
    if cs is not None:
        from transformers import AutoTokenizer  # heavy; only the continuations need the tokenizer object

        t0 = time.perf_counter()
        train_ids = generate_continuations(target, AutoTokenizer.from_pretrained(str(tdir)),
                                           corpus_split(settings.heldout_every)[0], folder,
                                           settings.feature_tokens + settings.seq_len + 1, cs, progress=progress)
        gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    extract_features(target, train_ids, cfg.aux_layers, folder, fs, target_id=target_id, progress=progress)
    extract_s = time.perf_counter() - t0
    data = load_features(folder, fs)
    vocab = None
    if cfg.vocab_cut:
        vocab = frequent_vocab(tdir, settings.draft_vocab_size, target.args.vocab_size, cfg=read_hf_config(tdir))
    head, train_s = train_from_features(target, settings, data, vocab, progress)
    info = {"text": settings.data, "features": str(folder), "windows": data.windows,
            "tokens": data.windows * settings.seq_len, "bytes": data.nbytes,
            "generate_s_this_run": round(gen_s, 1) if cs is not None else None,
            "continuations": asdict(cs) if cs is not None else None,
            "extract_s_this_run": round(extract_s, 1),
            "draft_vocab_size": settings.draft_vocab_size,
            "draft_vocab_coverage": None if vocab is None else round(vocab.coverage, 4)}
    return head, train_s, info


def make_eagle3_head(
    target_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    settings: Eagle3Settings = Eagle3Settings(),
    *,
    force: bool = False,
    progress: Progress | None = None,
) -> Eagle3Result:
    """Train (or reuse) an EAGLE-3 head for ``target_dir`` into ``out_dir``."""
    if settings.trainer not in TRAINERS:
        raise ModelError(f"trainer {settings.trainer!r} is not known", fix=f"use one of {', '.join(TRAINERS)}")
    if settings.steps < 1:
        raise ModelError(f"steps must be >= 1 (got {settings.steps})")
    tdir, out = pathlib.Path(target_dir), pathlib.Path(out_dir)
    if not (tdir / "config.json").is_file():
        raise ModelError(f"target model folder not found or has no config.json: {tdir}",
                         fix=missing_model_fix(str(tdir)))
    target_id = hash_folder(tdir)
    key = settings.key(target_id)
    have = maybe_manifest(out)
    if not force and have and have.get("settings_key") == key:
        return Eagle3Result(out, have["trainer"], have["params"], have["train_s"],
                            have["acceptance"]["acceptance_length"], have["acceptance"]["acceptance_rate"],
                            have["step_accuracy"], cached=True)

    if settings.data not in DATA:
        raise ModelError(f"data {settings.data!r} is not known", fix=f"use one of {', '.join(DATA)}")
    if settings.data != "corpus" and settings.feature_tokens is None:
        raise ModelError(f"data {settings.data!r}: the target's continuations are real-scale training data "
                         "(extracted features)", fix="add --scale real, or use --data corpus")
    if settings.feature_tokens is not None and settings.trainer != "native":
        raise ModelError(f"feature_tokens {settings.feature_tokens}: training from extracted features is the native "
                         f"trainer's (got trainer {settings.trainer!r})", fix="use --trainer native")
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    try:
        target = load_causal_lm(tdir, dtype=getattr(torch, settings.target_dtype))
        for p in target.parameters():
            p.requires_grad_(False)
        head_config_for(target, settings)  # bad aux_layers fail before seconds of tokenizing
        t0 = time.perf_counter()
        train_ids, held_ids = corpus_ids(tdir, settings.heldout_every)
        data_s = time.perf_counter() - t0
        data_info: dict = {}
        with atomic_dir(out) as tmp:
            if settings.feature_tokens is not None:
                head, train_s, data_info = _train_real_scale(tdir, target, target_id, settings, train_ids, progress)
                feature_norm = "standard"
                save_head(head.to(torch.bfloat16), tmp, target_cfg=read_hf_config(tdir))  # as published heads are
            elif settings.trainer == "native":
                head, train_s = train_native(target, settings, train_ids, progress)
                feature_norm = "standard"
                save_head(head, tmp, target_cfg=read_hf_config(tdir))
            else:
                train_s = train_modelopt(tdir, target, settings, train_ids, tmp, progress)
                feature_norm = "modelopt"
            # measure what the runtime will load: the exported folder, not the in-memory head
            write_manifest(tmp, "eagle3_head", feature_norm=feature_norm)
            head = load_eagle3_head(tmp, target)
            gen = torch.Generator().manual_seed(settings.seed + 2)
            windows = _windows(held_ids, 8, settings.seq_len, gen)
            accs = step_accuracy(head, target, windows, settings.ttt_steps)
            acc = measure_acceptance(target, head, eval_prompts(held_ids, settings.eval_prompts),
                                     max_new_tokens=settings.eval_new_tokens, max_draft_len=settings.max_draft_len)
            write_manifest(
                tmp, "eagle3_head",
                feature_norm=feature_norm,
                trainer=settings.trainer,
                settings=asdict(settings),
                settings_key=key,
                target={"path": str(tdir), "content_sha256": target_id},
                aux_layers=list(head.aux_layers),
                params=count_params(head),
                train_s=round(train_s, 1),
                data_s=round(data_s, 1),
                data=data_info or None,
                step_accuracy=accs,
                step_accuracy_definition="teacher-forced top-1 agreement with the target on held-out windows, "
                                         "draft step 1..ttt_steps+1",
                acceptance=acc,
                acceptance_definition="greedy engine run on held-out stdlib prompts; acceptance length = "
                                      "tokens per target pass",
                torch_threads=settings.threads,
                torch_version=torch.__version__,
                format="ModelOpt export_speculative_decoding layout (TRT-LLM speculative_model)",
            )
        return Eagle3Result(out, settings.trainer, count_params(head), train_s, acc["acceptance_length"],
                            acc["acceptance_rate"], accs)
    finally:
        torch.set_num_threads(prev_threads)
