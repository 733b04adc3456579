"""The tiny target/draft pair that tests and the CPU demo run on, trained here from local text.

Corpus: the Python standard library's own ``*.py`` files (ships with every Python). A byte-level
BPE tokenizer (vocab 4096) is trained on them; then a Llama target (~10M parameters) is trained on
next-token prediction, and a 1-layer Llama draft (~3M) is *distilled* on the target's output
distribution (KL to the teacher, plus cross-entropy on the teacher's argmax), starting from the
target's embedding and LM head projected to the draft's width: training the draft on the data
alone gives much lower top-1 agreement with the target (reference/models.md), and agreement is
what speculation pays on. The draft joins halfway through the target's training, taught by the
logits of the target's own steps (no second forward), then goes on alone against the finished
target: a quarter less time than distilling only the finished target, which the test suite pays
on every fresh checkout.

Deterministic for a given seed, thread count and machine; the result is cached: re-running with
the same settings returns the existing folders (their manifest records the settings hash).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sysconfig
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch
import torch.nn.functional as F

from trtspec.corpus import corpus_split
from trtspec.manifest import atomic_dir, hash_json, maybe_manifest, write_manifest
from trtspec.model_makers import TINY_DRAFT, TINY_TARGET
from trtspec.speculative.kernels import cpu_flags
from trtspec.speculative.model import CausalLM, ModelArgs, count_params

EOS = "<|endoftext|>"
PAD = "<|pad|>"

Progress = Callable[[str, int, int, dict], None]  # (phase, step, total, metrics)


@dataclass(frozen=True)
class Arch:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int


@dataclass(frozen=True)
class TinySettings:
    seed: int = 0
    vocab_size: int = 4096
    seq_len: int = 128
    batch_size: int = 16
    target: Arch = Arch(384, 4, 6, 2, 1152)
    draft: Arch = Arch(256, 1, 4, 2, 768)
    # measured with bf16 training on the 2-core box (one run each, `make demo`'s served verdict):
    # 240/450 steps: agreement 0.812, 6.0 min; 200/300: agreement 0.811, acceptance rate 0.60,
    # 4.2 min (fp32 240/450 was 0.807, acceptance rate 0.53, about 8 min)
    target_steps: int = 200
    draft_steps: int = 200
    # the target step from which the draft trains beside it, taught by the logits of the target's
    # own training step (no second target forward); target_steps = distil only the finished target.
    # fp32 on a 2-core Xeon: 100 (100 shared steps, then 100 alone) agreement 0.777, 214 s in all;
    # 200 with 300 draft steps 0.796, 270 s; 0 (no warm start worth the name) 0.555
    draft_joins_at: int = 100
    # draft warm start: embedding and LM head = the target's projected onto their top principal
    # directions (a draft narrower than the target cannot share them as they are)
    draft_init: str = "target_pca"  # or "random"
    # weight of cross-entropy on the target's argmax next to the KL: greedy acceptance pays on top-1
    draft_top1_weight: float = 0.5
    target_lr: float = 3e-3
    draft_lr: float = 3e-3
    eval_windows: int = 16
    threads: int = 2
    max_position_embeddings: int = 2048
    heldout_every: int = 16  # every 16th stdlib file is held out for evaluation
    # matmul precision while training: "bf16" autocasts forward passes to bfloat16 (weights, optimizer
    # state and the saved checkpoint stay float32); "auto" picks bf16 where the CPU has native bf16
    # (AVX512-BF16/AMX: 1.65x faster per step on the 2-core box) and fp32 elsewhere
    precision: str = "auto"

    def __post_init__(self):
        if self.draft_init not in ("target_pca", "random"):
            raise ValueError(f"draft_init: unknown value {self.draft_init!r}; use target_pca or random")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision: unknown value {self.precision!r}; use auto, bf16 or fp32")
        if not 0 <= self.draft_joins_at <= self.target_steps:
            raise ValueError(f"draft_joins_at: {self.draft_joins_at} is not a target step; use 0 to "
                             f"target_steps ({self.target_steps}, distil only the finished target)")

    def resolved(self) -> "TinySettings":
        """The same settings with ``precision`` fixed for this machine (what the cache key hashes)."""
        if self.precision != "auto":
            return self
        return replace(self, precision="bf16" if cpu_has_native_bf16() else "fp32")

    def key(self) -> str:
        return hash_json(asdict(self))[:16]


@dataclass
class TinyResult:
    target_dir: pathlib.Path
    draft_dir: pathlib.Path
    agreement: float
    target_params: int
    draft_params: int
    target_train_s: float
    draft_train_s: float
    target_eval_loss: float
    draft_eval_loss: float
    cached: bool = False
    extra: dict = field(default_factory=dict)


def cpu_has_native_bf16() -> bool:
    """True where the CPU has bf16 dot products (AVX512-BF16 or AMX), by its flags. oneDNN's own
    ``_is_mkldnn_bf16_supported`` also says True on plain AVX512, where bf16 matmuls are emulated:
    a 2-core Xeon without avx512_bf16 trained the tiny pair past 10 minutes in bf16 that way. Where
    the flags cannot be read (not Linux), oneDNN's answer."""
    flags = cpu_flags()
    if flags:
        return bool({"avx512_bf16", "amx_bf16"} & flags)
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


# --------------------------------------------------------------------------------------------
# corpus and tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE wrapped as a ``PreTrainedTokenizerFast`` (saved beside each model)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=PAD, unk_token=None, model_max_length=2048
    )


def encode_corpus(tokenizer, texts: list[str]) -> torch.Tensor:
    # the backend tokenizer directly: the same ids, without transformers' "longer than the maximum
    # sequence length" warning for every long file (these are whole files, cut into windows later)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for enc in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def _windows(data: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - length - 1, (n,), generator=gen)
    return torch.stack([data[s : s + length] for s in starts.tolist()])


def _eval_windows(data: torch.Tensor, n: int, length: int) -> torch.Tensor:
    step = max((data.numel() - length - 1) // n, 1)
    return torch.stack([data[i * step : i * step + length] for i in range(n)])


# --------------------------------------------------------------------------------------------
# training


def _model_args(a: Arch, s: TinySettings, eos: int) -> ModelArgs:
    return ModelArgs(
        vocab_size=s.vocab_size,
        hidden_size=a.hidden_size,
        intermediate_size=a.intermediate_size,
        num_hidden_layers=a.num_hidden_layers,
        num_attention_heads=a.num_attention_heads,
        num_key_value_heads=a.num_key_value_heads,
        head_dim=a.hidden_size // a.num_attention_heads,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=s.max_position_embeddings,
        tie_word_embeddings=False,
        attention_bias=False,
        bos_token_id=eos,
        eos_token_id=eos,
    )


def _init(model: CausalLM, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            std = 0.02 / (math.sqrt(2 * model.args.num_hidden_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0)
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)


def _lr(step: int, total: int, peak: float) -> float:
    warm = max(total // 15, 5)
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(total - warm, 1)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


class _Trainer:
    """One model's optimizer and learning-rate schedule, stepped from outside (the target and
    the draft step in the same loop while they train together)."""

    def __init__(self, model, steps: int, lr: float, phase: str, progress: Progress | None):
        self.model, self.steps, self.peak, self.phase, self.progress = model, steps, lr, phase, progress
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
        self.done, self.seconds = 0, 0.0
        model.train()

    def step(self, loss: torch.Tensor, t0: float) -> None:
        """Backward ``loss`` (computed since ``t0``) and one optimizer step; the time since ``t0``
        counts as this model's training time."""
        for g in self.opt.param_groups:
            g["lr"] = _lr(self.done, self.steps, self.peak)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.done += 1
        self.seconds += time.perf_counter() - t0
        if self.progress:
            self.progress(self.phase, self.done, self.steps, {"loss": float(loss.detach())})


def _lm_loss(model, x):
    return _lm_loss_of(model(x[:, :-1], None).float(), x)


def _lm_loss_of(logits, x):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def _distill_loss(student_logits, teacher_logits, top1_weight: float):
    """KL(target || draft) over the full next-token distribution, teacher-forced, plus
    cross-entropy on the target's argmax (what greedy verification accepts)."""
    teacher = F.log_softmax(teacher_logits, -1)
    student = F.log_softmax(student_logits, -1)
    loss = F.kl_div(student.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean")
    if top1_weight:
        loss = loss + top1_weight * F.nll_loss(student.flatten(0, 1), teacher_logits.argmax(-1).flatten())
    return loss


@torch.inference_mode()
def eval_loss(model, windows: torch.Tensor) -> float:
    return float(_lm_loss(model, windows))


@torch.inference_mode()
def top1_agreement(target, draft, windows: torch.Tensor) -> float:
    """Teacher-forced: the share of positions where draft argmax == target argmax."""
    t = target(windows, None).argmax(-1)
    d = draft(windows, None).argmax(-1)
    return float((t == d).float().mean())


@torch.no_grad()
def warm_start_from_target(draft: CausalLM, target: CausalLM) -> None:
    """Start the draft's token geometry where the target's is: its embedding and LM head are the
    target's projected onto the top ``draft_hidden`` right-singular vectors P of [embedding; head]
    (``E_t @ P``, ``H_t @ P``), and its final-norm gains the target's averaged through ``|P|``.
    Measured on the tiny pair (450 steps, with the top-1 term): acceptance length at K=4 3.44 -> 3.75."""
    e, h = target.model.embed_tokens.weight, target.lm_head.weight
    d = draft.args.hidden_size
    if d > e.shape[1] or draft.args.vocab_size != target.args.vocab_size:
        raise ValueError("warm start needs a draft no wider than the target, with the same vocabulary")
    _, _, vh = torch.linalg.svd(torch.cat([e, h]).float(), full_matrices=False)
    p = vh[:d].T  # [target_hidden, draft_hidden]
    draft.model.embed_tokens.weight.copy_(e @ p)
    draft.lm_head.weight.copy_(h @ p)
    draft.model.norm.weight.copy_(target.model.norm.weight @ p.abs() / p.abs().sum(0))


def save_hf(model: CausalLM, tokenizer, folder: pathlib.Path) -> None:
    """Write an ordinary HF Llama checkpoint folder (config.json, model.safetensors, tokenizer)."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    a = model.args
    LlamaConfig(
        vocab_size=a.vocab_size,
        hidden_size=a.hidden_size,
        intermediate_size=a.intermediate_size,
        num_hidden_layers=a.num_hidden_layers,
        num_attention_heads=a.num_attention_heads,
        num_key_value_heads=a.num_key_value_heads,
        head_dim=a.head_dim,
        rms_norm_eps=a.rms_norm_eps,
        rope_theta=a.rope_theta,
        max_position_embeddings=a.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=a.bos_token_id,
        eos_token_id=a.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        architectures=["LlamaForCausalLM"],
        torch_dtype="float32",
    ).save_pretrained(folder)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)
    portable_tokenizer_config(folder)


def portable_tokenizer_config(folder: pathlib.Path) -> None:
    """transformers 5 saves ``tokenizer_class: TokenizersBackend``, which transformers 4.57 (what
    TensorRT-LLM 1.2 pins, in NVIDIA's container) cannot load; ``PreTrainedTokenizerFast`` is the
    same fast tokenizer to both."""
    path = folder / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def _train_pair(target: CausalLM, draft: CausalLM, s: TinySettings, batches: Callable, progress) -> tuple[float, float]:
    """The target learns the corpus for ``target_steps``. From its step ``draft_joins_at`` the
    draft (warm-started from the target as it is then) is distilled on the same batches, with the
    logits of the target's own training step as the teacher: no second target forward for those
    steps. After the target's last step the draft goes on alone against the trained target until
    it has taken ``draft_steps``. Returns the seconds each model took (a shared step's target
    forward counts as the target's)."""
    join = min(s.draft_joins_at, s.target_steps)
    t = _Trainer(target, s.target_steps, s.target_lr, "target", progress)
    d = None

    def start_draft() -> _Trainer:
        if s.draft_init == "target_pca":
            warm_start_from_target(draft, target)
        return _Trainer(draft, s.draft_steps, s.draft_lr, "draft", progress)

    for step in range(s.target_steps):
        if step == join:
            d = start_draft()
        x = batches()
        t0 = time.perf_counter()
        with _autocast(s.precision):
            logits = target(x[:, :-1], None).float()
            loss = _lm_loss_of(logits, x)
        t.step(loss, t0)
        if d is not None and d.done < s.draft_steps:
            t0 = time.perf_counter()
            with _autocast(s.precision):
                loss = _distill_loss(draft(x[:, :-1], None).float(), logits.detach(), s.draft_top1_weight)
            d.step(loss, t0)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    d = d or start_draft()
    while d.done < s.draft_steps:
        x = batches()
        t0 = time.perf_counter()
        with torch.no_grad(), _autocast(s.precision):
            teacher = target(x[:, :-1], None).float()
        with _autocast(s.precision):
            loss = _distill_loss(draft(x[:, :-1], None).float(), teacher, s.draft_top1_weight)
        d.step(loss, t0)
    draft.eval()
    return t.seconds, d.seconds


def make_tiny_models(
    out_dir: str | os.PathLike = "models",
    settings: TinySettings = TinySettings(),
    *,
    force: bool = False,
    progress: Progress | None = None,
) -> TinyResult:
    """Train (or reuse) ``out_dir/tiny-target`` and ``out_dir/tiny-draft``."""
    out = pathlib.Path(out_dir)
    tdir, ddir = out / TINY_TARGET, out / TINY_DRAFT
    settings = settings.resolved()
    key = settings.key()
    mt, md = maybe_manifest(tdir), maybe_manifest(ddir)
    if not force and mt and md and mt.get("settings_key") == key and md.get("settings_key") == key:
        return TinyResult(
            tdir, ddir, md["agreement"], mt["params"], md["params"], mt["train_s"], md["train_s"],
            mt["eval_loss"], md["eval_loss"], cached=True,
        )

    prev_threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    try:
        t0 = time.perf_counter()
        if progress:
            progress("tokenizer", 0, 2, {})
        train_texts, held_texts = corpus_split(settings.heldout_every)
        tokenizer = train_tokenizer(train_texts, settings.vocab_size)
        if progress:
            progress("tokenizer", 1, 2, {})
        train_ids = encode_corpus(tokenizer, train_texts)
        held_ids = encode_corpus(tokenizer, held_texts)
        if progress:
            progress("tokenizer", 2, 2, {})
        tok_s = time.perf_counter() - t0
        eos = tokenizer.convert_tokens_to_ids(EOS)
        gen = torch.Generator().manual_seed(settings.seed)
        L = settings.seq_len + 1

        def batches():
            return _windows(train_ids, settings.batch_size, L, gen)

        heldout = _eval_windows(held_ids, settings.eval_windows, L)

        target = CausalLM(_model_args(settings.target, settings, eos))
        _init(target, settings.seed)
        draft = CausalLM(_model_args(settings.draft, settings, eos))
        _init(draft, settings.seed + 1)
        t_s, d_s = _train_pair(target, draft, settings, batches, progress)

        if progress:
            progress("evaluate", 0, 1, {})
        agreement = top1_agreement(target, draft, heldout[:, :-1])
        t_loss, d_loss = eval_loss(target, heldout), eval_loss(draft, heldout)
        if progress:
            progress("evaluate", 1, 1, {})
        common = {
            "settings": asdict(settings),
            "settings_key": key,
            "corpus": f"python {sysconfig.get_python_version()} stdlib *.py ({len(train_texts)} train / {len(held_texts)} held-out files)",
            "train_tokens": int(train_ids.numel()),
            "heldout_tokens": int(held_ids.numel()),
            "tokenizer_s": round(tok_s, 2),
            "torch_threads": settings.threads,
            "torch_version": torch.__version__,
        }
        with atomic_dir(tdir) as tmp:
            save_hf(target, tokenizer, tmp)
            write_manifest(
                tmp, "model", role="target", params=count_params(target), train_s=round(t_s, 1),
                eval_loss=round(t_loss, 4), **common,
            )
        with atomic_dir(ddir) as tmp:
            save_hf(draft, tokenizer, tmp)
            write_manifest(
                tmp, "model", role="draft", params=count_params(draft), train_s=round(d_s, 1),
                eval_loss=round(d_loss, 4), agreement=round(agreement, 4),
                agreement_definition="teacher-forced top-1 agreement with tiny-target on held-out stdlib text",
                **common,
            )
        return TinyResult(tdir, ddir, agreement, count_params(target), count_params(draft), t_s, d_s, t_loss, d_loss)
    finally:
        torch.set_num_threads(prev_threads)
