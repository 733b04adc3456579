"""EAGLE-3 head for the torch runtime (Li et al. 2025, "EAGLE-3: Scaling up Inference
Acceleration of Large Language Models via Training-Time Test").

The head drafts from the target's own features instead of running a second LM:

  feature   f_j = fc(concat(h_low_j, h_mid_j, h_high_j))      target layer outputs at position j
  layer     a_j = concat(input_layernorm(embed(x_{j+1})), hidden_norm(f_j))     [.., 2H]
            g_j = f_j + attn(a_j) ;  g_j = g_j + mlp(post_attention_layernorm(g_j))
  logits    lm_head(norm(g_j))  → distribution of x_{j+2}      (the target's LM head and embedding)

Drafting beyond the first token has no target features yet, so the head feeds its own output
``g_j`` (pre-norm) as the next position's feature: autoregressive in feature space.

Weights and config use the layout ModelOpt's ``export_speculative_decoding`` writes and TRT-LLM's
PyTorch flow reads as ``speculative_model``: ``config.json`` (``LlamaForCausalLMEagle3`` +
``eagle_config``) and ``model.safetensors`` with ``fc.weight``, ``layers.0.*``, ``norm.weight``,
``lm_head.weight``. ``eagle_aux_hidden_state_layer_ids`` index decoder-layer *outputs* (ModelOpt
and TRT-LLM convention; vLLM counts the embedding as 0, so its ids are ours + 1).

Feature normalisation: TRT-LLM and the reference implementation feed ``hidden_norm(f)`` to the
attention. ModelOpt 0.47's HF plugin runs the decoder layer's ``input_layernorm`` on ``f`` first
and then ``hidden_norm`` (``hidden_norm(input_layernorm(f))``), a different function once the
norm weights train away from 1. ``feature_norm="modelopt"`` reproduces that exactly; heads
trained by ModelOpt record it in their manifest. Everything else (and TRT-LLM) is "standard".

KV cache: the head keeps its own cache, rolled back exactly like a draft model's. Positions
computed from *target* features are kept (``valid``); positions computed from the head's own
features while drafting are discarded after verification and recomputed with the target's
features of the accepted tokens, which the verify pass returns for free.
"""

from __future__ import annotations

import json
import pathlib
import time
from dataclasses import dataclass

import torch
from torch import nn

from trtspec.errors import ModelError
from trtspec.speculative.model import (MLP, Attention, CausalLM, Int4Linear, Int8Linear, KVCache, ModelArgs, RMSNorm, Step, attention,
                                       kernel_layer_args, quantize_layer_weight_only_, rotate_half, step_inputs)
from trtspec.speculative.kernels import wo_cpu
from trtspec.speculative.loaders import loader_for
from trtspec.speculative.proposers import DraftModelProposer, Proposal
from trtspec.speculative.sampling import greedy_token, logits_to_probs, sample
from trtspec.manifest import maybe_manifest
from trtspec.speculative.model import read_hf_config

ARCHITECTURE = "LlamaForCausalLMEagle3"
FEATURE_NORMS = ("standard", "modelopt")


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """Low/mid/high target layers whose outputs make the feature.

    ModelOpt and TRT-LLM default to ``(1, n//2 - 1, n - 4)``; that collapses for shallow targets
    (a 4-layer target gives ``(0, 1)``), so below 8 layers take the first, middle and last layer.
    """
    if num_layers >= 8:
        return (1, num_layers // 2 - 1, num_layers - 4)
    return tuple(sorted({0, num_layers // 2, num_layers - 1}))


@dataclass(frozen=True)
class HeadConfig:
    """What ``config.json`` of an EAGLE-3 head says, plus how its feature is normalised."""

    layer: ModelArgs  # the head's decoder layer (hidden_size = the target's)
    aux_layers: tuple[int, ...]
    feature_norm: str = "standard"
    draft_vocab_size: int | None = None  # None/= vocab: the target's LM head; below: an own head + d2t

    @property
    def vocab_cut(self) -> bool:
        return self.draft_vocab_size is not None and self.draft_vocab_size < self.layer.vocab_size

    def to_hf_config(self, *, target_cfg: dict | None = None, dtype: str = "float32") -> dict:
        """The config ModelOpt's exporter writes (its llama template) for this head."""
        a, t = self.layer, target_cfg or {}
        return {
            "architectures": [ARCHITECTURE],
            "bos_token_id": t.get("bos_token_id", a.bos_token_id),
            "eos_token_id": t.get("eos_token_id", a.eos_token_id),
            "hidden_act": "silu",
            "hidden_size": a.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": a.intermediate_size,
            "max_position_embeddings": a.max_position_embeddings,
            "model_type": "llama",
            "num_attention_heads": a.num_attention_heads,
            "num_key_value_heads": a.num_key_value_heads,
            "num_hidden_layers": 1,
            "pad_token_id": t.get("pad_token_id"),
            "rms_norm_eps": a.rms_norm_eps,
            "tie_word_embeddings": False,
            "torch_dtype": dtype,
            "use_cache": True,
            "vocab_size": a.vocab_size,
            "draft_vocab_size": self.draft_vocab_size or a.vocab_size,
            "rope_scaling": None,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "head_dim": a.head_dim,
            "mlp_bias": False,
            "pretraining_tp": 1,
            "rope_theta": a.rope_theta,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
                "use_aux_hidden_state": True,
                "use_input_layernorm_in_first_layer": True,
                "use_last_layernorm": True,
                "use_mtp_layernorm": False,
                "next_layer_regular": True,
                "parallel_draft_step": 1,
                "parallel_draft_heads_num_layers": 1,
            },
        }

    @classmethod
    def from_hf_config(cls, cfg: dict, *, where: str = "config.json", feature_norm: str = "standard") -> "HeadConfig":
        archs = cfg.get("architectures") or []
        if archs != [ARCHITECTURE]:
            raise ModelError(
                f"{where}: architectures {archs} is not an EAGLE-3 head",
                fix=f"point at a head folder with architectures [{ARCHITECTURE!r}] "
                    "(trtspec models eagle3, or ModelOpt's export_speculative_decoding)",
            )
        ec = cfg.get("eagle_config") or {}
        ids = ec.get("eagle_aux_hidden_state_layer_ids") or []
        if not ec.get("use_aux_hidden_state", False) or not ids:
            raise ModelError(f"{where}: eagle_config.use_aux_hidden_state is off or has no "
                             f"eagle_aux_hidden_state_layer_ids (an EAGLE-1 style head)",
                             fix="train an EAGLE-3 head (aux hidden states from several target layers)")
        if cfg.get("num_hidden_layers", 1) != 1:
            raise ModelError(f"{where}: num_hidden_layers={cfg['num_hidden_layers']}; the torch runtime runs 1-layer heads",
                             fix="use a 1-layer EAGLE-3 head")
        if not ec.get("use_last_layernorm", True):
            raise ModelError(f"{where}: eagle_config.use_last_layernorm is false; the head needs norm.weight",
                             fix="export with use_last_layernorm: true")
        draft_vocab = cfg.get("draft_vocab_size") or cfg["vocab_size"]
        if not 0 < draft_vocab <= cfg["vocab_size"]:
            raise ModelError(f"{where}: draft_vocab_size {draft_vocab} is not in 1..vocab_size ({cfg['vocab_size']})",
                             fix="export the head again (draft_vocab_size = the rows of its lm_head)")
        rope = cfg.get("rope_scaling") or {}
        if rope and rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ModelError(
                f"{where}: rope_scaling {rope} is not supported by the torch runtime",
                fix="re-export with ModelOpt's eagle_export_rope_scaling={} (it injects yarn x32 by default "
                    "although training used default RoPE)",
            )
        if feature_norm not in FEATURE_NORMS:
            raise ModelError(f"{where}: feature_norm {feature_norm!r}", fix=f"use one of {FEATURE_NORMS}")
        layer = ModelArgs(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=1,
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(cfg.get("rope_theta") or 10000.0),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=False,
            attention_bias=bool(cfg.get("attention_bias", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=cfg.get("eos_token_id"),
        )
        return cls(layer, tuple(int(i) for i in ids), feature_norm,
                   draft_vocab if draft_vocab < cfg["vocab_size"] else None)


class Eagle3Layer(nn.Module):
    """The head's decoder layer: attention over the 2H-wide concat(embedding, feature)."""

    def __init__(self, a: ModelArgs, feature_norm: str = "standard"):
        super().__init__()
        self.self_attn = Attention(a)
        H, D = a.hidden_size, a.head_dim
        # q/k/v read [embedding ; feature], twice the hidden size; o_proj writes H as usual
        self.self_attn.q_proj = nn.Linear(2 * H, a.num_attention_heads * D, bias=a.attention_bias)
        self.self_attn.k_proj = nn.Linear(2 * H, a.num_key_value_heads * D, bias=a.attention_bias)
        self.self_attn.v_proj = nn.Linear(2 * H, a.num_key_value_heads * D, bias=a.attention_bias)
        self.mlp = MLP(a)
        self.input_layernorm = RMSNorm(H, a.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, a.rms_norm_eps)
        self.feature_norm = feature_norm

    def attn_input(self, feature: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        f = self.input_layernorm(feature) if self.feature_norm == "modelopt" else feature
        return torch.cat([self.input_layernorm(emb), self.hidden_norm(f)], dim=-1)  # [B, T, 2H]

    def forward(self, feature, emb, cos, sin, k_cache, v_cache, step, mask, index):
        x = feature + self.self_attn(self.attn_input(feature, emb), cos, sin, k_cache, v_cache, step, mask, index)
        return x + self.mlp(self.post_attention_layernorm(x))


def rope_tables(n: int, head_dim: int, theta: float, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[n, head_dim]`` in HF's convention (cat(freqs, freqs)), as the target's model."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    emb = torch.cat([torch.outer(torch.arange(n, dtype=torch.float32), inv)] * 2, dim=-1)
    return emb.cos().to(device, dtype), emb.sin().to(device, dtype)


class Eagle3Head(nn.Module):
    """fc + one decoder layer + final norm. Parameter names are the export's tensor names.

    ``embed`` is the target's (not a parameter of the head). The LM head is the target's too,
    unless the head drafts over a draft vocabulary (``cfg.draft_vocab_size``, EAGLE-3's reduced
    vocabulary): then it owns ``lm_head`` (``draft_vocab_size`` rows, trained) and ``d2t``, the
    int64 offsets from a draft index to its target id, named and laid out as ModelOpt's
    ``export_speculative_decoding`` writes them and TRT-LLM's ``Eagle3`` draft model loads them;
    ``t2d`` (the kept target ids as a mask, which SpecForge checkpoints also carry) is derived.
    """

    def __init__(self, cfg: HeadConfig, embed: nn.Embedding, lm_head: nn.Linear):
        super().__init__()
        a = cfg.layer
        self.cfg, self.args = cfg, a
        self.fc = nn.Linear(len(cfg.aux_layers) * a.hidden_size, a.hidden_size, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(a, cfg.feature_norm)])
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self._shared = (embed, lm_head)  # a tuple: not registered as submodules
        if cfg.vocab_cut:
            self.lm_head = nn.Linear(a.hidden_size, cfg.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            # derived from d2t, not exported: ModelOpt's export (and so TRT-LLM's loader) carries d2t only
            self.register_buffer("t2d", torch.zeros(a.vocab_size, dtype=torch.bool), persistent=False)
        self._rope: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self._draft_lm_head: Int8Linear | None = None  # see quantize_weight_only_
        self._kernel: tuple | bool | None = None  # see kernel_layer

    @property
    def aux_layers(self) -> tuple[int, ...]:
        return self.cfg.aux_layers

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self._shared[0](ids)

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[.., draft_vocab_size]`` (index ``i`` is target id ``to_target(i)``)."""
        if self._draft_lm_head is not None:
            return self._draft_lm_head.forward(self.norm(g))
        return (self.lm_head if self.cfg.vocab_cut else self._shared[1])(self.norm(g))

    def to_target(self, idx: torch.Tensor) -> torch.Tensor:
        """Draft indices → target ids (EAGLE-3's d2t offsets); the identity without a cut."""
        return idx + self.d2t[idx] if self.cfg.vocab_cut else idx

    def set_vocab_(self, target_ids: torch.Tensor) -> "Eagle3Head":
        """Cut the head to ``target_ids`` (ascending): its own LM head starts from the target's rows."""
        if not self.cfg.vocab_cut or target_ids.numel() != self.cfg.draft_vocab_size:
            raise ModelError(f"set_vocab_: {target_ids.numel()} ids for a head of draft_vocab_size "
                             f"{self.cfg.draft_vocab_size}", fix="build the head config with that draft_vocab_size")
        ids = target_ids.to(self.d2t.device, torch.long)
        with torch.no_grad():
            self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
            self.t2d.zero_()
            self.t2d[ids] = True
            w = self._shared[1].weight
            self.lm_head.weight.copy_(w.detach()[ids.to(w.device)].to(self.lm_head.weight.dtype))
        return self

    @torch.no_grad()
    def quantize_weight_only_(self) -> "Eagle3Head":
        """Draft with INT8 weights (:class:`~trtspec.speculative.model.Int8Linear`): fc, the
        decoder layer's projections (q|k|v and gate|up fused) and a private INT8 copy of the
        target's LM head (or the target's own, where it is already INT8/INT4 weight-only). The
        target's head is not changed, so verification is unchanged. Inference
        only (training needs the fp weights); not reversible."""
        layer = self.layers[0]
        at, mlp = layer.self_attn, layer.mlp
        projs = (at.q_proj, at.k_proj, at.v_proj, at.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj, self.fc)
        if not all(type(p) is nn.Linear for p in projs):
            raise ModelError("this EAGLE-3 head is already quantized (ModelOpt or INT8 weight-only); quantizing it again "
                             "would compound the error",
                             fix="set runtime.draft_weight_only: none, or use the unquantized head")
        quantize_layer_weight_only_(at, mlp)
        self._kernel = None
        self.fc = Int8Linear(self.fc.weight, None)
        src = self.lm_head if self.cfg.vocab_cut else self._shared[1]
        # a target whose LM head is already weight-only (INT8/INT4 kernels): draft through that one
        self._draft_lm_head = src if type(src) in (Int8Linear, Int4Linear) else Int8Linear(src.weight, None)
        return self

    def cos_sin(self, n: int, device, dtype):
        r = self._rope
        # tables built under inference_mode cannot enter autograd (training after an eval)
        stale = r is None or r[0] < n or r[1].device != device or r[1].dtype != dtype
        if stale or (r[1].is_inference() and not torch.is_inference_mode_enabled()):
            cos, sin = rope_tables(max(n, 256), self.args.head_dim, self.args.rope_theta, device, dtype)
            self._rope = (max(n, 256), cos, sin)
        return self._rope[1], self._rope[2]

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        p = self.norm.weight
        return KVCache(self.args, batch, max_len, p.dtype, p.device)

    def forward(
        self,
        feature: torch.Tensor,  # [B, T, H] fused feature fc(target layers) or the head's own g
        input_ids: torch.Tensor,  # [B, T] the token *after* each feature's position
        cache: KVCache | None,
        step: Step | None = None,
    ) -> torch.Tensor:
        """→ g ``[B, T, H]`` (pre-norm; ``logits(g)`` drafts, ``g`` is the next feature)."""
        B, T = input_ids.shape
        dev = input_ids.device
        if cache is None:
            step = Step(list(range(B)), [0] * B, T)
        cos_t, sin_t = self.cos_sin(step.kv_len, dev, feature.dtype)
        kernel = self.kernel_layer() if cache is not None and step.continuing else None
        if kernel is not None:  # one C++ call for the layer (kernel_layer)
            layer, (weights, meta, eps) = self.layers[0], kernel
            xin = layer.attn_input(feature, self.embed(input_ids)).reshape(B * T, -1)
            out = wo_cpu().layer_step_in(feature.reshape(B * T, -1).contiguous(), xin.contiguous(), weights, meta,
                                         eps, cache.k[0], cache.v[0], step.rows, step.starts, T, cos_t, sin_t)
            return out.view(B, T, -1)
        cos, sin, mask, index = step_inputs(step, B, T, cos_t, sin_t, cached=cache is not None)
        kc, vc = (cache.k[0], cache.v[0]) if cache is not None else (None, None)
        return self.layers[0](feature, self.embed(input_ids), cos, sin, kc, vc, step, mask, index)

    def kernel_layer(self):
        """The decoder layer's arguments for trtspec's one-call CPU layer step
        (``wo_cpu.layer_step_in``: q|k|v read the given ``attn_input``, the feature is the
        residual), or None: made once, where the head runs on INT8 weights (``quantize_weight_only_``)
        in bf16 on a CPU with trtspec's kernels. Draft steps then run the layer's ~50 torch ops
        as one call; the prelude (two norms, a concat) and fc stay torch ops."""
        if self._kernel is None:
            args = None
            if self.norm.weight.is_cpu and self.norm.weight.dtype == torch.bfloat16 and self.args.hidden_size % 64 == 0:
                args = kernel_layer_args(self.layers[0])
            self._kernel = args if args is not None else False
        return self._kernel or None

    # ---- training-time test (TTT): attention over several draft steps at once

    def ttt_forward(
        self,
        feature: torch.Tensor,  # [B, T, H]
        input_ids: torch.Tensor,  # [B, T]
        past: list[tuple[torch.Tensor, torch.Tensor]],  # K/V [B, Hkv, T, D] of steps 0..s-1
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Draft step ``s = len(past)`` for every position at once (EAGLE-3 §3.3, training-time test).

        Row position ``j`` of step ``s`` is the s-th draft step after anchor ``a = j - s`` (the
        last position with target features). At inference it sees the anchor's prefix computed
        from target features (step 0 keys at positions <= a) and its own chain (step ``t`` keys at
        position ``a + t``, t = 1..s); this mask reproduces exactly that.
        """
        layer = self.layers[0]
        at = layer.self_attn
        B, T, _ = feature.shape
        H, Hkv, D = at.n_heads, at.n_kv, at.head_dim
        cos_t, sin_t = self.cos_sin(T, feature.device, feature.dtype)
        cos, sin = cos_t[:T], sin_t[:T]  # [T, D]
        a = layer.attn_input(feature, self.embed(input_ids))
        q = at.q_proj(a).view(B, T, H, D).transpose(1, 2)
        k = at.k_proj(a).view(B, T, Hkv, D).transpose(1, 2)
        v = at.v_proj(a).view(B, T, Hkv, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        s = len(past)
        keys = torch.cat([pk for pk, _ in past] + [k], dim=2)  # [B, Hkv, (s+1)T, D]
        values = torch.cat([pv for _, pv in past] + [v], dim=2)
        i = torch.arange(T, device=feature.device)
        blocks = [i[None, :] <= (i[:, None] - s)]  # step 0: keys at positions <= anchor
        blocks += [i[None, :] == (i[:, None] - s + t) for t in range(1, s + 1)]  # chain steps
        mask = torch.cat(blocks, dim=1)  # [T, (s+1)T]; the t = s block is the diagonal, never empty
        out = attention(q, keys, values, attn_mask=mask, enable_gqa=Hkv != H)
        x = feature + at.o_proj(out.transpose(1, 2).reshape(B, T, H * D))
        return x + layer.mlp(layer.post_attention_layernorm(x)), (k, v)


# --------------------------------------------------------------------------------------------
# load / save


HEAD_TENSORS = (
    "fc.weight",
    "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
    "layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight", "layers.0.hidden_norm.weight",
    "norm.weight",
)


def head_state_dict(head: Eagle3Head) -> dict[str, torch.Tensor]:
    """The export's tensors: the head's own plus ``lm_head.weight`` (copied from the target,
    as ModelOpt writes it; TRT-LLM then uses it instead of the target's)."""
    sd = {k: v.detach().contiguous() for k, v in head.state_dict().items()}
    if not head.cfg.vocab_cut:  # a cut head's own lm_head, d2t and t2d are in its state already
        sd["lm_head.weight"] = head._shared[1].weight.detach().contiguous()
    return sd


def save_head(head: Eagle3Head, folder: str | pathlib.Path, *, target_cfg: dict | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` in ModelOpt's export layout."""
    from safetensors.torch import save_file

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dtype = str(head.fc.weight.dtype).removeprefix("torch.")
    cfg = head.cfg.to_hf_config(target_cfg=target_cfg, dtype=dtype)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(head_state_dict(head), str(folder / "model.safetensors"), metadata={"format": "pt"})


def load_eagle3_head(
    folder: str | pathlib.Path,
    target: CausalLM,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> Eagle3Head:
    """Load a head folder for ``target``; checks that the head was made for this target."""
    from safetensors.torch import load_file


    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise ModelError(f"EAGLE-3 head folder not found: {folder}",
                         fix="train one with `trtspec models eagle3 --target DIR --out DIR`")
    manifest = maybe_manifest(folder) or {}
    load_quantized_head = loader_for(manifest.get("kind"), "eagle3_head")
    if load_quantized_head is not None:  # `trtspec quantize` of a head: ModelOpt state, fake-quant
        return load_quantized_head(folder, target, dtype=dtype, device=device)
    cfg = HeadConfig.from_hf_config(read_hf_config(folder), where=str(folder / "config.json"),
                                    feature_norm=manifest.get("feature_norm", "standard"))
    t = target.args
    where = str(folder / "config.json")
    if cfg.layer.hidden_size != t.hidden_size:
        raise ModelError(f"{where}: head hidden_size {cfg.layer.hidden_size} != target hidden_size {t.hidden_size}",
                         fix="train the head on this target (trtspec models eagle3)")
    if cfg.layer.vocab_size != t.vocab_size:
        raise ModelError(f"{where}: head vocab_size {cfg.layer.vocab_size} != target vocab_size {t.vocab_size}",
                         fix="train the head on this target (trtspec models eagle3)")
    bad = [i for i in cfg.aux_layers if not 0 <= i < t.num_hidden_layers]
    if bad:
        raise ModelError(f"{where}: eagle_aux_hidden_state_layer_ids {list(cfg.aux_layers)} name layers the target "
                         f"does not have (it has {t.num_hidden_layers})", fix="train the head on this target")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder}: no *.safetensors weights", fix="export the head again")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if cfg.vocab_cut:
        lm = state.get("lm_head.weight")
        d2t = state.get("d2t")
        if lm is None or d2t is None or lm.shape[0] != cfg.draft_vocab_size or d2t.numel() != cfg.draft_vocab_size:
            raise ModelError(f"{folder}: draft_vocab_size {cfg.draft_vocab_size} needs lm_head.weight and d2t with that "
                             f"many rows (got {None if lm is None else tuple(lm.shape)}, "
                             f"{None if d2t is None else tuple(d2t.shape)})", fix="export the head again")
        ids = d2t.long() + torch.arange(d2t.numel())
        if int(ids.min()) < 0 or int(ids.max()) >= t.vocab_size:
            raise ModelError(f"{folder}: d2t maps draft indices outside the target's vocabulary 0..{t.vocab_size - 1}",
                             fix="train the head on this target (trtspec models eagle3)")
        state["d2t"] = d2t.long()
        state.pop("t2d", None)  # SpecForge-style heads carry the mask too; it is derived from d2t here
        lm = None
    else:
        lm = state.pop("lm_head.weight", None)
    if lm is not None:
        # a copy of the target's LM head (ModelOpt writes one): a cheap "made for this target"
        # check, tolerant of dtype rounding (bf16 export of an fp32 target and the reverse)
        head = target.lm_head  # an INT8 copy where the target's LM head is quantized (quantization.lm_head)
        ref = (head.dequantized() if isinstance(head, Int8Linear) else head.weight).detach().float().cpu()
        if lm.shape != ref.shape or (lm.float() - ref).abs().max() > 1e-2 * ref.abs().max():
            raise ModelError(f"{folder}: the head's lm_head.weight differs from the target's: it was trained "
                             "for another target (or the target was changed since)",
                             fix="train the head on this target (trtspec models eagle3)")
    dtype = dtype or target.model.embed_tokens.weight.dtype
    device = device or target.model.embed_tokens.weight.device
    head = Eagle3Head(cfg, target.model.embed_tokens, target.lm_head)
    missing, unexpected = head.load_state_dict(state, strict=False)
    if cfg.vocab_cut:
        head.t2d[head.to_target(torch.arange(cfg.draft_vocab_size))] = True
    if missing or unexpected:
        raise ModelError(f"{folder}: tensors do not match an EAGLE-3 head: missing {missing[:5]}, unexpected {unexpected[:5]}",
                         fix=f"the export needs {', '.join(HEAD_TENSORS)} (+ lm_head.weight)")
    return head.to(device=device, dtype=dtype).eval()


# --------------------------------------------------------------------------------------------
# the proposer


class Eagle3Proposer:
    """Drafts with an EAGLE-3 head from the target's features (see the module docstring).

    Per slot: ``valid`` = head cache positions computed from target features; ``pending`` =
    target features ``[m, n*H]`` of positions ``valid .. valid+m-1`` not fed yet. The token
    paired with position ``j``'s feature is ``seq[j+1]``, so ``seq[valid+1:]`` are exactly the
    ``m`` pending tokens. A round feeds the pending positions (the last one's output drafts
    d_1), then drafts d_2..d_K from the head's own features; ``accept`` rolls back to ``valid``
    and queues the verify pass's features of the accepted tokens. ``prefill`` only queues the
    prompt's features; a row with more queued than a round gives (the prompt, or plain steps'
    positions) reads them alone first (:meth:`_catch_up`), timed apart for the goodput policy.
    """

    name = "eagle3"

    def __init__(self, head: Eagle3Head, max_slots: int, max_len: int):
        self.head = head
        self.target_hidden_layers = head.aux_layers
        self.cache = head.new_cache(max_slots, max_len)
        self.valid = [0] * max_slots
        self.pending: list[torch.Tensor | None] = [None] * max_slots
        self.device = head.norm.weight.device
        self.catch_up_s, self.catch_up_tokens = 0.0, 0  # see take_catch_up
        self._all = torch.arange(head.cfg.draft_vocab_size or head.args.vocab_size, device=self.device)

    @torch.inference_mode()
    def prefill(self, slot, seq, target_hidden=None):
        """Queue the prompt's features: the head reads them at the request's first proposal
        (:meth:`_catch_up`), after the first token has gone out, so the head adds nothing to the
        time to first token (as the draft model's proposer reads its prompt late)."""
        if target_hidden is None:
            raise ModelError("the EAGLE-3 proposer needs the target's hidden states at prefill",
                             fix="run it in an engine that honours target_hidden_layers")
        self.valid[slot] = 0
        self.pending[slot] = target_hidden[0].clone()  # [L, n*H], L = len(seq) - 1 (seq ends with the first token)

    def take_catch_up(self) -> tuple[float, int]:
        """(seconds, tokens) the head spent reading queued features alone since the last call (a
        prompt, or the positions of plain steps): paid once per token whatever the draft length,
        so the engine prices it apart from the per-token draft cost (GoodputPolicy.catch_up_share)."""
        out = (self.catch_up_s, self.catch_up_tokens)
        self.catch_up_s, self.catch_up_tokens = 0.0, 0
        return out

    # positions a catch-up would read before drafting (queued by plain steps, and a prompt not read
    # yet): counted from ``valid`` as the draft model's are
    behind = DraftModelProposer.behind

    def _catch_up(self, slots, seqs, most: int) -> None:
        """Each row with more than ``most`` queued positions (a prompt, or plain steps' positions)
        reads all but the last alone, in one pass; the batched feed then reads the last one. A
        round's own features (at most K+1) stay batched: padding them costs little."""
        t0, n = time.perf_counter(), 0
        for s, seq in zip(slots, seqs):
            p = self.pending[s]
            m = 0 if p is None else p.shape[0]
            if m > most:
                ids = torch.tensor([seq[self.valid[s] + 1 : self.valid[s] + m]], device=self.device)
                self.head(self.head.fc(p[None, : m - 1]), ids, self.cache, Step([s], [self.valid[s]], m - 1))
                self.valid[s] += m - 1
                self.pending[s] = p[m - 1 :]
                n += m - 1
        if n:
            self.catch_up_s += time.perf_counter() - t0
            self.catch_up_tokens += n

    def _feed(self, slots, seqs) -> torch.Tensor:
        """Feed every row's pending positions; returns g at each row's last one ``[B, H]``."""
        pend = [self.pending[s] for s in slots]
        if any(p is None or p.shape[0] == 0 for p in pend):
            raise ModelError("EAGLE-3 proposer: propose() without pending target features "
                             "(prefill/accept were not called for a slot)")
        ms = [p.shape[0] for p in pend]
        T = max(ms)
        starts = [self.valid[s] for s in slots]
        if max(starts) + T > self.cache.max_len:  # padding would run past the cache: one row at a time
            return torch.cat([self._feed([s], [q]) for s, q in zip(slots, seqs)])
        nH = pend[0].shape[1]
        feats = torch.zeros(len(slots), T, nH, dtype=pend[0].dtype, device=self.device)
        ids = []
        for b, (p, s, seq) in enumerate(zip(pend, slots, seqs)):
            feats[b, : ms[b]] = p
            toks = seq[self.valid[s] + 1 : self.valid[s] + 1 + ms[b]]
            ids.append(toks + [toks[-1]] * (T - ms[b]))  # padding: written past valid, overwritten later
        g = self.head(self.head.fc(feats), torch.tensor(ids, device=self.device), self.cache, Step(slots, starts, T))
        for s, m in zip(slots, ms):
            self.valid[s] += m
            self.pending[s] = None
        last = torch.tensor([m - 1 for m in ms], device=self.device)
        return g[torch.arange(len(slots), device=self.device), last]  # [B, H]

    @torch.inference_mode()
    def propose(self, slots, seqs, ks, params, generators):
        B, K = len(slots), max(ks)
        head = self.head
        self._catch_up(slots, seqs, K + 1)
        g = self._feed(slots, seqs)
        greedy = all(p.greedy for p in params)
        tokens, probs = [], []
        for i in range(K):
            logits = self.head.logits(g)  # [B, V]
            if greedy:
                x = head.to_target(greedy_token(logits))
            else:
                q = torch.stack([logits_to_probs(logits[b], params[b]) for b in range(B)])  # [B, Vd]
                if head.cfg.vocab_cut:  # q over the target's vocabulary: zero outside the cut
                    q = q.new_zeros(B, head.args.vocab_size).index_copy_(1, head.to_target(self._all), q)
                x = torch.stack([sample(q[b], generators[b]) for b in range(B)])
                probs.append(q)
            tokens.append(x)
            if i < K - 1:  # own feature g → next position; written past valid, rolled back in accept
                step = Step(slots, [self.valid[s] + i for s in slots], 1)
                g = self.head(g[:, None], x[:, None], self.cache, step)[:, 0]
        return Proposal(
            torch.stack(tokens, 1),
            torch.stack(probs, 1) if probs else None,
            torch.tensor(ks, device=self.device),
        )

    def accept(self, slots, seqs, accepted, target_hidden=None):
        if target_hidden is None:
            raise ModelError("the EAGLE-3 proposer needs the verify pass's hidden states",
                             fix="run it in an engine that honours target_hidden_layers")
        for b, (s, n) in enumerate(zip(slots, accepted)):
            new = target_hidden[b, : n + 1]  # features of [pending token, d_1..d_n]
            old = self.pending[s]
            # a step without drafting (k = 0) leaves earlier pending features unfed: keep them
            self.pending[s] = new.clone() if old is None else torch.cat([old, new])

    def release(self, slot):
        self.valid[slot] = 0
        self.pending[slot] = None


def eagle3_proposer(spec, target: CausalLM, dtype, device) -> Eagle3Proposer:
    if not spec.draft:
        raise ModelError("eagle3 needs an EAGLE-3 head folder", fix="set speculation.head.model (or --head DIR)")
    head = load_eagle3_head(spec.draft, target, dtype=dtype, device=device)
    if spec.runtime.draft_weight_only == "int8":
        head.quantize_weight_only_()
    return Eagle3Proposer(head, spec.limits.max_batch_size, spec.limits.max_seq_len + spec.max_draft_len + 2)
