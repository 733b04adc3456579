"""A lean Llama/Qwen2 decoder for the torch runtime (gpt-fast style), loading HF checkpoints.

Why not ``transformers``' own forward: at the sizes a draft model has, per-call Python overhead
dominates, and speculative decoding needs a KV cache that rolls back by moving a pointer. This
module keeps module names identical to HF (``model.layers.N.self_attn.q_proj`` …), so HF
safetensors load as they are and ModelOpt quantizer state restores onto it by name.

KV-cache invariant (what makes rollback free): row ``b`` holds valid keys/values for positions
``[0, length_b)``; anything at or beyond ``length_b`` is garbage. Attention is causal by
*absolute* position (query at ``p`` sees keys ``<= p``), and every forward writes its tokens at
``length_b, length_b+1, …`` before reading, so garbage is always overwritten before it is seen.
Rolling back rejected draft tokens is therefore ``length_b = accepted_length``.
"""

from __future__ import annotations

import json
import math
import pathlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from trtspec.errors import ModelError
from trtspec.model_makers import missing_model_fix
from trtspec.speculative.kernels import op, wo_cpu

SUPPORTED_ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "llama"}


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # Qwen2: q/k/v projections carry a bias
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @classmethod
    def from_hf_config(cls, cfg: dict, *, where: str = "config.json") -> "ModelArgs":
        archs = cfg.get("architectures") or []
        if not archs or archs[0] not in SUPPORTED_ARCHS:
            raise ModelError(
                f"{where}: architecture {archs or cfg.get('model_type')!r} is not supported by the torch runtime",
                fix=f"use one of {sorted(SUPPORTED_ARCHS)} or a trtllm runtime",
            )
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if rope_type not in ("default", None):
            raise ModelError(
                f"{where}: rope scaling {rope_type!r} is not supported by the torch runtime",
                fix="use a checkpoint with default RoPE, or a trtllm runtime",
            )
        theta = cfg.get("rope_theta") or (rope.get("rope_theta") if isinstance(rope, dict) else None) or 10000.0
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", SUPPORTED_ARCHS[archs[0]] == "qwen2")),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.variance_epsilon)
        # HF semantics: normalise in fp32, scale in the model dtype (one fused op for the first half:
        # a decode step of a 28-layer model makes 57 of these calls, each op costs µs of dispatch)
        x32 = F.rms_norm(x.float(), (x.shape[-1],), None, self.variance_epsilon)
        return self.weight * x32.to(x.dtype)


def _wo_mm(kernel, custom_op, x2, packed, scales, group: int, bits: int) -> torch.Tensor:
    """trtspec's CPU weight-only matmul: the module's function in eager code, the custom op (one
    graph, runtime.compile_draft) under torch.compile (kernels.op)."""
    if torch.compiler.is_compiling():
        return custom_op(x2, packed, scales, group, bits)
    return kernel.mm(x2, packed, scales, group, bits)


class _WeightOnlyLinear(nn.Module):
    """What :class:`Int8Linear` and :class:`Int4Linear` share: ``bits``; ``group``, the input
    channels per scale (INT8: all of them, one scale per row); ``packed``, the CPU layout made on
    first use; and, once trtspec's layout is made, that layout as the only copy of the weights."""

    bits: int

    @property
    def on_cpu(self) -> bool:
        return self.packed is not None or self.qweight.is_cpu

    @property
    def int_values(self) -> torch.Tensor:
        """The INT values [out, in] (INT4: in [-8, 7]), unpacked where the packed copy is the only one."""
        if self.qweight is not None:
            return self.qweight
        kernel, _, packed, _ = self.packed
        return kernel.unpack(packed, self.bits, self.in_features)

    def _keep_packed_only(self) -> None:
        """Once trtspec's CPU layout is made it is the only copy of the weights: the row-major INT
        values go (a second copy of every quantized weight: 1.4 GiB for the Qwen 1.5B target), and
        :attr:`int_values` unpacks them again for whoever asks (``dequantized``, tests)."""
        self.qweight = None  # the buffer stays registered, empty (state_dict skips it)


class Int8Linear(_WeightOnlyLinear):
    """A linear layer with INT8 weights, one scale per output channel (W8A16, "weight-only").

    The scales are ModelOpt's ``int8_wo`` / TRT-LLM's ``--weight_only_precision int8`` rule:
    ``scale = max|w_row| / 127``, ``q = round(w / scale)``. On CPU the matmul runs in torch's
    INT8-weight kernel (``aten._weight_int8pack_mm``, bfloat16 activations): the weights are read
    as 1 byte instead of 4, which is what a memory-bound decode step pays for. Elsewhere the
    weights are dequantized on the fly. Inference only.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, amax: torch.Tensor | None = None):
        """``amax``: a calibrated per-output-channel range (ModelOpt's ``weight_quantizer.amax``);
        the INT8 values are then ModelOpt's own (``round(w * 127 / amax)``), not a second
        quantization. Without it, ``amax = max|w_row|`` (the same rule)."""
        super().__init__()
        w = weight.detach().float()
        if amax is not None:
            a = amax.detach().float().reshape(-1).clamp_min(1e-12)
            if a.numel() != w.shape[0]:
                raise ModelError(f"INT8 weight-only: {a.numel()} scales for {w.shape[0]} output channels",
                                 fix="the checkpoint's weight quantizer must be per output channel (axis 0)")
            q = torch.round(w * (127.0 / a)[:, None])
            scales = (a / 127.0).to(torch.bfloat16)
        else:
            # the kernel takes the scales in the activation dtype (bf16); quantize with the bf16
            # scales so that qweight * scales is exactly the grid the kernel computes with
            scales = (w.abs().amax(dim=1).clamp_min(1e-12) / 127.0).to(torch.bfloat16)
            q = torch.round(w / scales.float()[:, None])
        self.register_buffer("qweight", q.clamp_(-127, 127).to(torch.int8).contiguous())
        self.register_buffer("scales", scales)
        self.in_features = self.group = w.shape[1]
        self.bias = None if bias is None else bias.detach().clone()
        self.packed = None  # (kernel, op, weights, scales) on CPU, made on first use (see _pack)

    bits = 8

    def _pack(self):
        """trtspec's CPU layout (kernels/wo_cpu.cpp) where it runs, else torch's (kernel None)."""
        kernel = wo_cpu()
        out_f, in_f = self.qweight.shape
        if kernel is None or out_f % 4 or in_f % 64:
            self.packed = (None, None, self.qweight, self.scales)
        else:
            self.packed = (kernel, op(), kernel.pack(self.qweight, 8), self.scales.float()[:, None].contiguous())
            self._keep_packed_only()
        return self.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        if self.on_cpu:
            kernel, custom_op, w, scales = self.packed or self._pack()
            if kernel is None:
                y = torch.ops.aten._weight_int8pack_mm(x2, w, scales)
            else:
                y = _wo_mm(kernel, custom_op, x2, w, scales, self.group, self.bits)
        else:
            y = F.linear(x2, self.qweight.to(torch.bfloat16)) * self.scales
        y = y.to(x.dtype).view(*lead, -1)
        return y if self.bias is None else y + self.bias

    def dequantized(self) -> torch.Tensor:
        return self.int_values.float() * self.scales.float()[:, None]


class Int4Linear(_WeightOnlyLinear):
    """A linear layer with INT4 weights in blocks of ``group`` input channels (W4A16), as ModelOpt's
    ``int4_wo`` / ``int4_awq`` store them: per block ``scale = amax / 7``, ``q = round(w / scale)``
    in [-8, 7], symmetric. On CPU the matmul runs in torch's INT4 kernel
    (``aten._weight_int4pack_mm_for_cpu``, bf16 activations; weights read as half a byte);
    elsewhere they are dequantized per call. ``pre_quant_scale`` (AWQ): the per-input-channel
    factor ModelOpt applies to the activations before the quantized matmul. Inference only."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, amax: torch.Tensor, group: int = 128,
                 pre_quant_scale: torch.Tensor | None = None):
        """``weight``: the checkpoint's weights (or ModelOpt's fake-quantized grid of them);
        ``amax``: the calibrated range of each block, ``out * in / group`` values in row order."""
        super().__init__()
        w = weight.detach().float()
        out_f, in_f = w.shape
        if in_f % group or out_f % 16:
            raise ModelError(f"INT4 weight-only: a {out_f}x{in_f} weight does not fit blocks of {group} "
                             "(input channels) and torch's INT4 kernel (output channels a multiple of 16)",
                             fix="keep this model on emulated kernels (runtime.quantized_kernels: emulated)")
        a = amax.detach().float().reshape(out_f, in_f // group).clamp_min(1e-12)
        scale = a / 7.0
        q = torch.round(w.view(out_f, in_f // group, group) / scale[..., None]).clamp_(-8, 7)
        self.group, self.in_features = group, in_f
        self.register_buffer("qweight", q.view(out_f, in_f).to(torch.int8).contiguous())  # the INT4 values
        self.register_buffer("scales", scale.to(torch.bfloat16).contiguous())  # [out, groups]
        self.packed = None  # torch's CPU INT4 layout, made on first use on CPU
        self.pre_quant_scale = None if pre_quant_scale is None else pre_quant_scale.detach().clone()
        self.bias = None if bias is None else bias.detach().clone()

    bits = 4

    def _pack(self):
        kernel = wo_cpu()
        if kernel is not None and self.qweight.shape[0] % 4 == 0 and self.group % 64 == 0:
            # trtspec's AVX512 kernel (kernels/wo_cpu.cpp: the bf16 or the fma build)
            self.packed = (kernel, op(), kernel.pack(self.qweight, 4), self.scales.float().contiguous())
            self._keep_packed_only()
        else:
            q = (self.qweight.to(torch.int32) + 8).contiguous()
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            zeros = torch.zeros_like(self.scales)
            self.packed = (None, None, packed, torch.stack([self.scales.t(), zeros.t()], dim=-1).contiguous())
        return self.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        if self.pre_quant_scale is not None:
            x = x * self.pre_quant_scale.to(x.dtype)
        x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        if self.on_cpu:
            kernel, custom_op, packed, scales = self.packed or self._pack()
            if kernel is None:
                y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, packed, self.group, scales)
            else:
                y = _wo_mm(kernel, custom_op, x2, packed, scales, self.group, self.bits)
        else:
            out_f, in_f = self.qweight.shape
            w = (self.qweight.view(out_f, in_f // self.group, self.group).to(torch.bfloat16)
                 * self.scales[..., None]).view(out_f, in_f)
            y = F.linear(x2, w)
        y = y.to(x.dtype).view(*lead, -1)
        return y if self.bias is None else y + self.bias


@torch.no_grad()
def int4_layer_(at: "Attention", mlp: "MLP", amax: dict[str, torch.Tensor],
                pre_quant_scale: dict[str, torch.Tensor] | None = None, group: int = 128) -> None:
    """One decoder layer's projections in INT4 (:class:`Int4Linear`), from ModelOpt's block ranges
    ``amax`` per projection name. Without AWQ scales q|k|v and gate|up are fused, as for INT8;
    with them (one per projection, generally different) each projection keeps its own."""
    pqs = pre_quant_scale or {}
    mods = {"q_proj": at, "k_proj": at, "v_proj": at, "o_proj": at, "gate_proj": mlp, "up_proj": mlp,
            "down_proj": mlp}
    if not pqs:
        bias = None if at.q_proj.bias is None else torch.cat([at.q_proj.bias, at.k_proj.bias, at.v_proj.bias])
        at.fused = Int4Linear(torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]), bias,
                              torch.cat([amax[n].reshape(-1) for n in ("q_proj", "k_proj", "v_proj")]), group)
        mlp.fused = Int4Linear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), None,
                               torch.cat([amax[n].reshape(-1) for n in ("gate_proj", "up_proj")]), group)
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(at, name, nn.Identity())
        mlp.gate_proj, mlp.up_proj = nn.Identity(), nn.Identity()
        names = ("o_proj", "down_proj")
    else:
        names = tuple(mods)
    for name in names:
        lin = getattr(mods[name], name)
        setattr(mods[name], name, Int4Linear(lin.weight, lin.bias, amax[name], group, pqs.get(name)))


@torch.no_grad()
def quantize_layer_weight_only_(at: "Attention", mlp: "MLP", amax: dict[str, torch.Tensor] | None = None) -> None:
    """One decoder layer's projections in INT8: q|k|v and gate|up fused into one
    :class:`Int8Linear` each, o and down on their own; the fp projections are dropped.
    ``amax``: per projection name (``q_proj``, …), a calibrated range per output channel."""
    def ranges(*names: str) -> torch.Tensor | None:
        return None if amax is None else torch.cat([amax[n].reshape(-1) for n in names])

    bias = None if at.q_proj.bias is None else torch.cat([at.q_proj.bias, at.k_proj.bias, at.v_proj.bias])
    at.fused = Int8Linear(torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]), bias,
                          ranges("q_proj", "k_proj", "v_proj"))
    mlp.fused = Int8Linear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), None, ranges("gate_proj", "up_proj"))
    at.o_proj = Int8Linear(at.o_proj.weight, at.o_proj.bias, ranges("o_proj"))
    mlp.down_proj = Int8Linear(mlp.down_proj.weight, None, ranges("down_proj"))
    for name in ("q_proj", "k_proj", "v_proj"):  # only the fused INT8 copy is used from now on
        setattr(at, name, nn.Identity())
    mlp.gate_proj, mlp.up_proj = nn.Identity(), nn.Identity()


def _linear(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``mod(x)`` without ``nn.Module.__call__`` for a plain ``nn.Linear`` or an :class:`Int8Linear`
    (the hook machinery costs a few µs per call, and a 1-layer draft makes ~10 such calls per
    token); wrapped linears (ModelOpt's QuantLinear, …) go through their own call as usual."""
    t = type(mod)
    if t is nn.Linear:
        return F.linear(x, mod.weight, mod.bias)
    if t is Int8Linear or t is Int4Linear:
        return mod.forward(x)
    return mod(x)


def _kernel_layer(layer: "DecoderLayer"):
    """``layer``'s arguments for the CPU kernel's one-call layer step (``wo_cpu.layer_step``), or
    None where it does not apply: every projection fused and packed on trtspec's kernel (not
    torch's, no AWQ pre-scale), bf16 norms, Llama/Qwen2 shapes the kernel takes."""
    return kernel_layer_args(layer) if type(layer) is DecoderLayer else None


def kernel_layer_args(layer: nn.Module):
    """:func:`_kernel_layer` for any layer made of an :class:`Attention`, an :class:`MLP` and the
    two norms (an EAGLE-3 head's layer too, which runs ``wo_cpu.layer_step_in``: its attention
    input is given, so its ``input_layernorm`` is applied by the caller)."""
    at, mlp = layer.self_attn, layer.mlp
    if type(at) is not Attention or type(mlp) is not MLP:
        return None
    if any(type(n) is not RMSNorm or n.weight.dtype != torch.bfloat16
           for n in (layer.input_layernorm, layer.post_attention_layernorm)):
        return None
    if layer.input_layernorm.variance_epsilon != layer.post_attention_layernorm.variance_epsilon:
        return None
    projs = (at.fused, at.o_proj, mlp.fused, mlp.down_proj)
    if any(type(q) not in (Int4Linear, Int8Linear) or not q.on_cpu or getattr(q, "pre_quant_scale", None) is not None
           for q in projs):
        return None
    if any(q.bias is not None for q in projs[1:]) or at.head_dim % 16 or at.head_dim > 512:
        return None
    packed = [q.packed or q._pack() for q in projs]
    if any(k is None for k, *_ in packed):
        return None
    bias = at.fused.bias
    if bias is not None and bias.dtype != torch.bfloat16:
        return None
    meta = [at.n_heads, at.n_kv, at.head_dim]
    for q in projs:
        meta += [q.group, q.bits]
    (_, _, qkv_w, qkv_s), (_, _, o_w, o_s), (_, _, gu_w, gu_s), (_, _, d_w, d_s) = packed
    weights = [layer.input_layernorm.weight.detach(), qkv_w, qkv_s,
               bias if bias is not None else torch.empty(0, dtype=torch.bfloat16), o_w, o_s,
               layer.post_attention_layernorm.weight.detach(), gu_w, gu_s, d_w, d_s]
    return weights, meta, float(layer.input_layernorm.variance_epsilon)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class KVCache:
    """Per-layer K/V buffers ``[batch, kv_heads, max_len, head_dim]`` for a fixed number of rows."""

    def __init__(self, args: ModelArgs, batch: int, max_len: int, dtype: torch.dtype, device: torch.device):
        shape = (batch, args.num_key_value_heads, max_len, args.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(args.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(args.num_hidden_layers)]
        self.batch, self.max_len = batch, max_len

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


@dataclass
class Step:
    """Where a forward writes: row ``rows[i]`` gets tokens at positions ``starts[i] … starts[i]+T-1``.

    Built once per forward on the host; ``rows`` selects cache rows (slots) so one request can be
    prefilled alone while others decode in a batch.
    """

    rows: list[int]
    starts: list[int]
    T: int

    def __post_init__(self):
        self.uniform = len(set(self.starts)) == 1
        self.contiguous_rows = self.rows == list(range(self.rows[0], self.rows[0] + len(self.rows)))
        self.kv_len = max(self.starts) + self.T  # keys a query may need to see
        # every row continues a sequence already in the cache (a decode or verify pass, not a prefill)
        self.continuing = min(self.starts) > 0


def step_inputs(step: Step, B: int, T: int, cos_t: torch.Tensor, sin_t: torch.Tensor, *, cached: bool):
    """What a forward of ``T`` tokens per row at ``step`` hands its attention layers: rope cos/sin
    (``[1|B, 1, T, D]``, from the ``[n, D]`` tables), the causal mask over the cached keys and the
    cache scatter index (``None`` where not needed). Shared by CausalLM and the EAGLE-3 head."""
    dev = cos_t.device
    if step.uniform:  # every row at the same positions: slice the tables, no gather
        s0 = step.starts[0]
        cos, sin = cos_t[s0 : s0 + T][None, None], sin_t[s0 : s0 + T][None, None]  # [1, 1, T, D]
        positions = None
    else:
        starts = torch.tensor(step.starts, device=dev)
        positions = starts[:, None] + torch.arange(T, device=dev)[None, :]  # [B, T]
        cos, sin = cos_t[positions][:, None], sin_t[positions][:, None]  # [B, 1, T, D]
    mask = index = None
    if cached and not (T == 1 and step.uniform):  # one query at the last position sees every key
        if positions is None:
            positions = (step.starts[0] + torch.arange(T, device=dev))[None, :].expand(B, T)
        keys = torch.arange(step.kv_len, device=dev)
        mask = (keys[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, T, S]
    if cached and not (step.uniform and step.contiguous_rows):
        if positions is None:
            positions = (step.starts[0] + torch.arange(T, device=dev))[None, :].expand(B, T)
        rows = torch.tensor(step.rows, device=dev)
        index = (rows[:, None, None].expand(B, 1, T), positions[:, None, :])
    return cos, sin, mask, index


# the fused backends CUDA attention may use: all but cuDNN (see attention)
_CUDA_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw) -> torch.Tensor:
    """``F.scaled_dot_product_attention``, on CUDA without the cuDNN backend: torch 2.11 picks
    cuDNN for bf16 on an H200, and cuDNN builds an execution plan for every new key length, which
    a decode step is: the tiny pair's bf16 plain decoding ran at 77 tok/s against 484 in fp32
    (scripts/check_cuda.py). Flash / memory-efficient / math are what it falls back to."""
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    with sdpa_kernel(_CUDA_SDPA):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def attention_per_row(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, starts: list[int],
                      gqa: bool) -> torch.Tensor:
    """Causal attention of ``q`` [B, H, T, D] (row ``b``'s queries at ``starts[b] …``) over
    ``keys``/``values`` [B, Hkv, S, D], one query at a time over exactly the keys it sees, in fp32
    (scores, softmax and the weighted sum; the result in ``q``'s dtype). A query's output is then
    a function of its own values only: the same bits in a one-token step, in a verify pass of K+1
    tokens, or beside other rows at other lengths. torch's fused kernel with a mask over a longer
    key range adds the same terms in another order (a last-bit difference in bf16 that can flip a
    near-tie later). For one query this is also cheaper than the fused kernel's setup on CPU."""
    B, H, T, D = q.shape
    Hkv = keys.shape[1]
    G = H // Hkv if gqa else 1  # query heads per KV head
    scale = D**-0.5
    out = torch.empty_like(q)
    for b in range(B):
        for t in range(T):
            n = starts[b] + t + 1
            qi = q[b, :, t].float().reshape(Hkv, G, D)  # [Hkv, G, D]
            k, v = keys[b, :, :n].float(), values[b, :, :n].float()  # [Hkv, n, D]
            p = torch.softmax(torch.bmm(qi, k.transpose(1, 2)) * scale, dim=-1)  # [Hkv, G, n]
            out[b, :, t] = torch.bmm(p, v).reshape(H, D).to(out.dtype)
    return out


class Attention(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        self.q_proj = nn.Linear(a.hidden_size, a.num_attention_heads * a.head_dim, bias=a.attention_bias)
        self.k_proj = nn.Linear(a.hidden_size, a.num_key_value_heads * a.head_dim, bias=a.attention_bias)
        self.v_proj = nn.Linear(a.hidden_size, a.num_key_value_heads * a.head_dim, bias=a.attention_bias)
        self.o_proj = nn.Linear(a.num_attention_heads * a.head_dim, a.hidden_size, bias=False)
        # see CausalLM.fuse_: (weight, bias) of q|k|v in one matmul, or that matmul in INT8
        self.fused: tuple[torch.Tensor, torch.Tensor | None] | Int8Linear | None = None
        self.batch_invariant = False  # see CausalLM.batch_invariant_

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        """q|k|v in one tensor [..., (H + 2 Hkv) D]: the fused matmul (fp or INT8), else the three
        projections (wrapped, e.g. by ModelOpt) one by one."""
        f = self.fused
        if f is None:
            return torch.cat([_linear(self.q_proj, x), _linear(self.k_proj, x), _linear(self.v_proj, x)], -1)
        return F.linear(x, *f) if type(f) is tuple else f.forward(x)

    def forward(self, x, cos, sin, k_cache, v_cache, step: Step, mask, index):
        B, T, _ = x.shape  # x: [B, T, hidden]
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        if self.fused is not None:
            qkv = self._qkv(x).view(B, T, H + 2 * Hkv, D).transpose(1, 2)  # [B, H+2Hkv, T, D]
            qk, v = qkv[:, : H + Hkv], qkv[:, H + Hkv :]
            qk = qk * cos + rotate_half(qk) * sin  # rope on q and k in one pass
            q, k = qk[:, :H], qk[:, H:]
        else:
            q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
            k = self.k_proj(x).view(B, T, Hkv, D).transpose(1, 2)  # [B, Hkv, T, D]
            v = self.v_proj(x).view(B, T, Hkv, D).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin  # cos/sin: [B, 1, T, D]
            k = k * cos + rotate_half(k) * sin
        if k_cache is None:  # training / scoring a whole sequence: plain causal attention
            out = attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != self.n_heads)
            return _linear(self.o_proj, out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))
        S = step.kv_len
        if step.uniform and step.contiguous_rows:
            r0, s0 = step.rows[0], step.starts[0]
            k_cache[r0 : r0 + B, :, s0 : s0 + T] = k
            v_cache[r0 : r0 + B, :, s0 : s0 + T] = v
            keys, values = k_cache[r0 : r0 + B, :, :S], v_cache[r0 : r0 + B, :, :S]
        else:
            rows_idx, pos_idx = index  # [B, 1, T] each, broadcast over heads
            heads = torch.arange(self.n_kv, device=x.device)[None, :, None]
            k_cache[rows_idx, heads, pos_idx] = k
            v_cache[rows_idx, heads, pos_idx] = v
            rows = rows_idx[:, 0, 0]
            keys, values = k_cache[rows, :, :S], v_cache[rows, :, :S]
        if self.batch_invariant and step.continuing:  # the one-token step too: the same function
            out = attention_per_row(q, keys, values, step.starts, self.n_kv != self.n_heads)
        else:
            out = attention(q, keys, values, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)  # [B, H, T, D]
        return _linear(self.o_proj, out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def decode_one(self, x, cos, sin, k_cache, v_cache, rows, pos, keep):
        """One token per row (``x``: [B, 1, hidden]) written at ``(rows, pos)``; attends to the
        row's keys where ``keep`` [B, S]. Index tensors only: see CausalLM.decode_one."""
        B = x.shape[0]
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        qkv = self._qkv(x).view(B, H + 2 * Hkv, D)
        qk, v = qkv[:, : H + Hkv], qkv[:, H + Hkv :]
        qk = qk * cos[:, 0] + rotate_half(qk) * sin[:, 0]
        q, k = qk[:, :H], qk[:, H:]
        heads = torch.arange(Hkv, device=x.device)[None, :]
        k_cache.index_put_((rows[:, None], heads, pos[:, None]), k)
        v_cache.index_put_((rows[:, None], heads, pos[:, None]), v)
        S = keep.shape[1]
        keys, values = k_cache[rows, :, :S], v_cache[rows, :, :S]  # [B, Hkv, S, D]
        # grouped-query attention for one query: q head h reads kv head h // (H / Hkv)
        scores = torch.matmul(q.view(B, Hkv, H // Hkv, D), keys.transpose(-1, -2)) * (D**-0.5)
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        out = torch.matmul(scores.softmax(-1), values)  # [B, Hkv, H/Hkv, D]
        return _linear(self.o_proj, out.reshape(B, 1, H * D))


class MLP(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.up_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)
        self.fused: torch.Tensor | Int8Linear | None = None  # see CausalLM.fuse_

    def forward(self, x):
        f = self.fused
        if f is not None:
            gate, up = (F.linear(x, f) if type(f) is torch.Tensor else f.forward(x)).chunk(2, dim=-1)
            return _linear(self.down_proj, F.silu(gate) * up)
        return _linear(self.down_proj, F.silu(_linear(self.gate_proj, x)) * _linear(self.up_proj, x))


class DecoderLayer(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.self_attn = Attention(a)
        self.mlp = MLP(a)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)

    def forward(self, x, cos, sin, k_cache, v_cache, step, mask, index):
        # submodules are called through .forward: the same code (a ModelOpt subclass's own forward
        # included) without nn.Module.__call__'s overhead; nothing hooks these inner modules
        x = x + self.self_attn.forward(self.input_layernorm.forward(x), cos, sin, k_cache, v_cache, step, mask, index)
        return x + self.mlp.forward(self.post_attention_layernorm.forward(x))


class _Body(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(a) for _ in range(a.num_hidden_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)


class CausalLM(nn.Module):
    """Decoder-only LM with an explicit KV cache. Module names match HF's ``*ForCausalLM``."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = _Body(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._rope_len = 0
        self.weight_only: str | None = None  # "int8" after quantize_weight_only_
        self.decode = None  # compiled decode_one after compile_decode_
        self._kernel_layers = None  # see kernel_layers
        self.vocab_ids: torch.Tensor | None = None  # the LM head's rows after restrict_vocab_ (a draft vocabulary)

    # ---- rope tables (HF convention: cos/sin of cat(freqs, freqs))
    def _rope(self, n: int, device, dtype):
        if self._rope_len < n or self._cos.device != device or self._cos.dtype != dtype:
            n = max(n, 256)
            a = self.args
            inv = 1.0 / (a.rope_theta ** (torch.arange(0, a.head_dim, 2, dtype=torch.int64).float() / a.head_dim))
            t = torch.arange(n, dtype=torch.float32)
            emb = torch.cat([torch.outer(t, inv)] * 2, dim=-1)
            self._cos, self._sin = emb.cos().to(device, dtype), emb.sin().to(device, dtype)
            self._rope_len = n
        return self._cos, self._sin

    @torch.no_grad()
    def fuse_(self) -> "CausalLM":
        """Inference speed-up: one matmul for q/k/v and one for gate/up (fewer kernel launches,
        which dominate at draft-model sizes). Skipped for wrapped (e.g. quantized) linears,
        whose weights must stay in their own modules. Idempotent; returns self.

        On CPU in float32 every plain linear's weight is also stored input-major (``[in, out]``
        contiguous, seen as the usual ``[out, in]`` through a transposed view): MKL's kernel for
        the usual layout slows down sharply from 4 rows up: the tiny target's matmuls for 5 rows
        (verifying 4 draft tokens) cost 2.1x those for one row; input-major 1.3x
        (``scripts/bench_linear_layout.py``).
        The values are unchanged; bfloat16 is left alone (input-major is slower there)."""
        emb = self.model.embed_tokens.weight
        input_major = emb.device.type == "cpu" and emb.dtype == torch.float32

        def layout(w: torch.Tensor) -> torch.Tensor:
            return w.t().contiguous().t() if input_major and w.is_contiguous() else w

        for layer in self.model.layers:
            at, mlp = layer.self_attn, layer.mlp
            projs = (at.q_proj, at.k_proj, at.v_proj, mlp.gate_proj, mlp.up_proj)
            if not all(type(p) is nn.Linear for p in projs):
                continue
            bias = None
            if at.q_proj.bias is not None:
                bias = torch.cat([at.q_proj.bias, at.k_proj.bias, at.v_proj.bias])
            at.fused = (layout(torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])), bias)
            mlp.fused = layout(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
            for lin in (at.o_proj, mlp.down_proj):
                if type(lin) is nn.Linear:
                    lin.weight.data = layout(lin.weight.data)
        if type(self.lm_head) is nn.Linear and not self.args.tie_word_embeddings:
            self.lm_head.weight.data = layout(self.lm_head.weight.data)
        return self

    @property
    def modelopt_quantized(self) -> bool:
        """ModelOpt wraps the linears it quantizes (QuantLinear, …): fake-quant, eager only."""
        return any(type(m).__name__.startswith("Quant") for m in self.modules())

    @torch.no_grad()
    def quantize_weight_only_(self) -> "CausalLM":
        """Run every linear layer (the LM head included) with INT8 weights (:class:`Int8Linear`).

        For a *draft* model: a draft token then reads about a quarter of the weight bytes, while
        the verifier (the unquantized target) still decides every emitted token, so outputs stay
        exactly the target's; only acceptance can move (``scripts/bench_engine.py`` shows both).
        A model with ModelOpt-wrapped linears is refused (it is already quantized).
        Not reversible: the fp weights of the replaced layers are dropped."""
        if self.weight_only:
            raise ModelError("this model already runs with INT8 weights", fix="load the checkpoint again")
        if self.modelopt_quantized:
            raise ModelError(
                "this model is already quantized by ModelOpt; INT8 weight-only would quantize it twice",
                fix="drop runtime.draft_weight_only, or use the unquantized checkpoint",
            )
        for layer in self.model.layers:
            quantize_layer_weight_only_(layer.self_attn, layer.mlp)
        if not self.args.tie_word_embeddings:
            self.lm_head = Int8Linear(self.lm_head.weight, None)
        else:  # the embedding keeps its fp weights; the head gets its own INT8 copy
            self.lm_head = Int8Linear(self.model.embed_tokens.weight, None)
        self.weight_only = "int8"
        self._kernel_layers = None
        return self

    @torch.no_grad()
    def restrict_vocab_(self, ids: torch.Tensor) -> "CausalLM":
        """Keep only the LM head's rows ``ids`` (a draft vocabulary, :mod:`trtspec.speculative.vocab`):
        logits come out over ``len(ids)`` draft indices; the embedding keeps every token, so any
        committed token can still be fed. A tied head gets its own copy of the rows. INT8/INT4 heads
        keep their INT values and scales (the same bits, fewer rows). Returns self."""
        idx = ids.to(device=self.model.embed_tokens.weight.device, dtype=torch.long)
        if self.vocab_ids is not None:  # several proposers (engines) may share one draft model
            if torch.equal(self.vocab_ids, idx):
                return self
            raise ModelError("this draft already drafts over another vocabulary cut", fix="load the draft again")
        head = self.lm_head
        if type(head) is nn.Linear:
            new = nn.Linear(head.in_features, idx.numel(), bias=head.bias is not None,
                            device=head.weight.device, dtype=head.weight.dtype)
            new.weight.copy_(head.weight[idx])
            if head.bias is not None:
                new.bias.copy_(head.bias[idx])
        elif isinstance(head, _WeightOnlyLinear):
            new = type(head).__new__(type(head))
            nn.Module.__init__(new)
            new.register_buffer("qweight", head.int_values[idx].contiguous())
            new.register_buffer("scales", head.scales[idx].contiguous())
            new.group, new.in_features, new.packed = head.group, head.in_features, None
            new.bias = None if head.bias is None else head.bias[idx].clone()
            if hasattr(head, "pre_quant_scale"):
                new.pre_quant_scale = head.pre_quant_scale
        else:
            raise ModelError(f"a draft vocabulary cannot cut a {type(head).__name__} LM head (ModelOpt fake-quant)",
                             fix="run the draft on native kernels (runtime.quantized_kernels: native), or drop "
                                 "speculation.draft_vocab_size")
        self.lm_head, self.vocab_ids = new, idx
        return self

    def kernel_layers(self) -> list | None:
        """Each layer's arguments for trtspec's one-call CPU layer step (kernels/wo_cpu.cpp,
        ``layer_step``), or None: made once, on the first decode or verify pass, where every layer
        qualifies (bf16, CPU, every projection on trtspec's INT4/INT8 kernel; see
        :func:`_kernel_layer`). Decode and verify passes then run one C++ call per layer instead
        of ~55 torch ops, whose dispatch was 20-30 % of a pass on the Qwen pair; prefill keeps the
        torch ops (its matmuls dominate). Its attention is per query row in fp32, like
        ``batch_invariant``'s, so every token row's result is the same in any pass."""
        if self._kernel_layers is None:
            emb = self.model.embed_tokens.weight
            layers = None
            if emb.is_cpu and emb.dtype == torch.bfloat16 and self.args.hidden_size % 64 == 0:
                layers = [_kernel_layer(layer) for layer in self.model.layers]
                if any(a is None for a in layers):
                    layers = None
            self._kernel_layers = layers if layers is not None else False
        return self._kernel_layers or None

    def batch_invariant_(self, on: bool = True) -> "CausalLM":
        """``runtime.batch_invariant``: in decode and verify passes (not a request's prefill, which
        runs alone and the same way every time) each query row attends through
        :func:`attention_per_row`, so its attention output is the one it gets in a one-token step,
        bit for bit, whatever else shares the pass. Together with row-invariant linears (torch's
        INT8/INT4 weight kernels, LM head included) a token's logits then do not depend on the pass
        it was computed in: speculative decoding emits exactly what plain decoding does. Returns self."""
        for layer in self.model.layers:
            layer.self_attn.batch_invariant = on  # the attention layers hold it: they are what it changes
        return self

    def unfuse_(self) -> "CausalLM":
        if self.weight_only:
            raise ModelError("an INT8 weight-only model cannot be unfused", fix="load the checkpoint again")
        for layer in self.model.layers:
            layer.self_attn.fused = None
            layer.mlp.fused = None
        return self

    # ---- one token per row, shapes friendly to torch.compile (the draft's inner loop)
    def decode_one(
        self,
        input_ids: torch.Tensor,  # [B, 1]
        cache: KVCache,
        rows: torch.Tensor,  # [B] cache rows
        pos: torch.Tensor,  # [B] where each row's token goes
        kv_len: int,  # max(pos) + 1: keys any query may see
        rope: tuple[torch.Tensor, torch.Tensor],  # self._rope(n ≥ kv_len): inputs, not attributes, of a compiled graph
    ) -> torch.Tensor:  # logits [B, V]
        """The same computation as ``forward`` for one token per row at arbitrary rows/positions,
        written with index tensors instead of a host-side :class:`Step`, so that one compiled graph
        (``compile_decode_``) serves every row set, position and batch size. Writes K/V at
        ``(rows, pos)`` and attends to keys ``<= pos`` of each row (same KV-cache invariant)."""
        cos_t, sin_t = rope
        cos, sin = cos_t[pos][:, None, None], sin_t[pos][:, None, None]  # [B, 1, 1, D]
        keep = torch.arange(kv_len, device=pos.device)[None, :] <= pos[:, None]  # [B, S]
        x = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            at = layer.self_attn
            x = x + at.decode_one(layer.input_layernorm.forward(x), cos, sin, cache.k[i], cache.v[i], rows, pos, keep)
            x = x + layer.mlp.forward(layer.post_attention_layernorm.forward(x))
        return _linear(self.lm_head, self.model.norm.forward(x))[:, 0]

    def compile_decode_(self) -> "CausalLM":
        """Compile :meth:`decode_one` with ``torch.compile`` (inductor; dynamic batch and length):
        a 1-layer draft's ~35 small ops per token fuse into a handful of kernels. Returns self;
        ``self.decode`` is then the compiled step (``None`` before). Compilation happens on the
        first call (seconds; inductor caches it on disk)."""
        if self.modelopt_quantized:
            raise ModelError(
                "a ModelOpt-quantized (fake-quant) model cannot be compiled by the torch runtime",
                fix="set runtime.compile_draft: false, or use the unquantized draft",
            )
        for m in self.modules():  # the CPU weight layouts now: a compiled graph cannot make them
            if type(m) in (Int8Linear, Int4Linear) and m.packed is None and m.qweight.is_cpu:
                m._pack()
        if self.decode is None:  # idempotent: several proposers (engines) may share one draft model
            self.decode = torch.compile(self.decode_one, dynamic=True, fullgraph=True)
        return self

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        p = self.model.embed_tokens.weight
        return KVCache(self.args, batch, max_len, p.dtype, p.device)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        cache: KVCache | None,
        step: Step | None = None,
        *,
        logits: str = "all",  # "all" → [B, T, V]; "last" → [B, 1, V]; "none" → no LM head
        hidden_layers: tuple[int, ...] = (),  # also return these layers' outputs (EAGLE features)
    ):
        B, T = input_ids.shape
        dev = input_ids.device
        if cache is None:  # whole sequences from position 0, no cache (training, scoring)
            step = Step(list(range(B)), [0] * B, T)
        cos_t, sin_t = self._rope(step.kv_len, dev, self.model.embed_tokens.weight.dtype)
        x = self.model.embed_tokens(input_ids)
        hidden: list[torch.Tensor] = []
        fused = self.kernel_layers() if cache is not None and step.continuing else None
        if fused is not None:  # one C++ call per layer (kernel_layers)
            kernel = wo_cpu()
            x = x.reshape(B * T, -1)
            for i, (weights, meta, eps) in enumerate(fused):
                x = kernel.layer_step(x, weights, meta, eps, cache.k[i], cache.v[i], step.rows, step.starts, T,
                                      cos_t, sin_t)
                if i in hidden_layers:
                    hidden.append(x.view(B, T, -1))
            x = x.view(B, T, -1)
        else:
            cos, sin, mask, index = step_inputs(step, B, T, cos_t, sin_t, cached=cache is not None)
            for i, layer in enumerate(self.model.layers):
                kc, vc = (cache.k[i], cache.v[i]) if cache is not None else (None, None)
                x = layer.forward(x, cos, sin, kc, vc, step, mask, index)
                if i in hidden_layers:
                    hidden.append(x)
        h = self.model.norm.forward(x)
        if logits == "none":
            out = None
        elif logits == "last":
            out = _linear(self.lm_head, h[:, -1:])
        else:
            out = _linear(self.lm_head, h)
        if hidden_layers:
            return out, hidden, h
        return out


def read_hf_config(folder: str | pathlib.Path) -> dict:
    folder = pathlib.Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelError(
            f"model folder {folder} has no config.json",
            fix="point at an HF checkpoint folder (config.json + *.safetensors + tokenizer files)",
        )
    return json.loads(cfg_path.read_text())


def load_causal_lm(
    folder: str | pathlib.Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> CausalLM:
    """Load an HF Llama/Qwen2 checkpoint (safetensors) into :class:`CausalLM`."""
    from safetensors.torch import load_file

    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise ModelError(f"model folder not found: {folder}", fix=missing_model_fix(str(folder)))
    args = ModelArgs.from_hf_config(read_hf_config(folder), where=str(folder / "config.json"))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder}: no *.safetensors weights", fix="save the model with safetensors")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise ModelError(f"{f}: cannot read the weights ({type(e).__name__}: {e})",
                             fix="the file is damaged or not safetensors: re-export or re-download the checkpoint") from None
    with torch.device("meta"):
        model = CausalLM(args)
    model = model.to_empty(device=device)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (args.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ModelError(
            f"{folder}: weights do not match a {SUPPORTED_ARCHS.get(read_hf_config(folder)['architectures'][0])} "
            f"model: missing {missing[:5]}, unexpected {unexpected[:5]}",
            fix="export the checkpoint with transformers' save_pretrained",
        )
    model._rope_len = 0
    return model.to(dtype).eval()


def count_params(model: nn.Module) -> int:
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def perplexity(nll_sum: float, n_tokens: int) -> float:
    return math.exp(nll_sum / max(n_tokens, 1))
