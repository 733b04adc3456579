"""Run ModelOpt-quantized models in the torch runtime (fake-quant, any device).

The quantized model is calibrated as a ``transformers`` model (ModelOpt's reference path; the
exports need it). Our :class:`~trtspec.speculative.model.CausalLM` has the same module names,
so ModelOpt's own restore (``restore_from_modelopt_state`` + ``load_state_dict``) rebuilds the
quantizers on it by name. Two things ModelOpt cannot know about our model are registered here:

* attention: ModelOpt's HF plugin quantizes K and V where transformers' attention interface
  receives them (after RoPE, before the GQA repeat). :class:`QuantAttention` applies the same
  ``k_bmm_quantizer`` / ``v_bmm_quantizer`` at the same point, before the tensors enter our KV
  cache (static per-tensor fake-quant is idempotent, so quantize-on-write equals HF's
  quantize-on-read of the whole cache);
* NVFP4 on CPU: the custom fake-quant backend of :mod:`trtspec.quantize.nvfp4_cpu`.

``tests/engine/test_quantize.py`` checks the restored model's logits against ModelOpt's HF model.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import warnings
from typing import Iterator

import torch

from trtspec.errors import ModelError
from trtspec.config import NATIVE_KERNELS
from trtspec.speculative.model import (Attention, CausalLM, Int4Linear, Int8Linear, ModelArgs, attention, int4_layer_,
                                       quantize_layer_weight_only_, read_hf_config, rotate_half)
from trtspec.manifest import read_manifest
from trtspec.quantize import nvfp4_cpu

STATE_FILE = "modelopt_state.pth"


@contextlib.contextmanager
def quiet(log: list[str] | None = None) -> Iterator[None]:
    """ModelOpt and transformers print and warn freely; the library must not. Captured stdout
    and warnings go to ``log`` (the CLI shows them under --debug; the manifest keeps warnings)."""
    buf = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(buf):
        warnings.simplefilter("always")
        try:
            from transformers.utils import logging as hf_logging

            bar, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()
        except ImportError:  # pragma: no cover - transformers is a dependency
            hf_logging = None
        try:
            yield
        finally:
            if hf_logging is not None:
                hf_logging.set_verbosity(verbosity)
                if bar:
                    hf_logging.enable_progress_bar()
    if log is not None:
        log.extend(line for line in buf.getvalue().splitlines() if line.strip())
        log.extend(f"{w.category.__name__}: {w.message}" for w in caught)


def _quant_attention_cls():
    from modelopt.torch.quantization.nn import QuantModule, TensorQuantizer

    class QuantAttention(QuantModule):
        """trtspec Attention with ModelOpt's KV-cache quantizers (names as in ModelOpt's HF plugin)."""

        def _setup(self):
            self.q_bmm_quantizer = TensorQuantizer()
            self.k_bmm_quantizer = TensorQuantizer()
            self.v_bmm_quantizer = TensorQuantizer()
            self.p_bmm_quantizer = TensorQuantizer()

        def forward(self, x, cos, sin, k_cache, v_cache, step, mask, index):
            if self.p_bmm_quantizer.is_enabled:
                raise ModelError(
                    "softmax (p_bmm) quantization is not supported by the torch runtime",
                    fix="use a KV-cache format (fp8, int8) that quantizes only K and V",
                )
            if not (self.q_bmm_quantizer.is_enabled or self.k_bmm_quantizer.is_enabled or self.v_bmm_quantizer.is_enabled):
                return Attention.forward(self, x, cos, sin, k_cache, v_cache, step, mask, index)
            B, T, _ = x.shape  # x: [B, T, in]
            H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
            q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
            k = self.k_proj(x).view(B, T, Hkv, D).transpose(1, 2)  # [B, Hkv, T, D]
            v = self.v_proj(x).view(B, T, Hkv, D).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            q, k, v = self.q_bmm_quantizer(q), self.k_bmm_quantizer(k), self.v_bmm_quantizer(v)
            if k_cache is None:
                out = attention(q, k, v, is_causal=True, enable_gqa=Hkv != H)
                return self.o_proj(out.transpose(1, 2).reshape(B, T, H * D))
            # cache writes/reads exactly as Attention.forward (see its KV-cache invariant)
            S = step.kv_len
            if step.uniform and step.contiguous_rows:
                r0, s0 = step.rows[0], step.starts[0]
                k_cache[r0 : r0 + B, :, s0 : s0 + T] = k
                v_cache[r0 : r0 + B, :, s0 : s0 + T] = v
                keys, values = k_cache[r0 : r0 + B, :, :S], v_cache[r0 : r0 + B, :, :S]
            else:
                rows_idx, pos_idx = index
                heads = torch.arange(Hkv, device=x.device)[None, :, None]
                k_cache[rows_idx, heads, pos_idx] = k
                v_cache[rows_idx, heads, pos_idx] = v
                rows = rows_idx[:, 0, 0]
                keys, values = k_cache[rows, :, :S], v_cache[rows, :, :S]
            out = attention(q, keys, values, attn_mask=mask, enable_gqa=Hkv != H)
            return self.o_proj(out.transpose(1, 2).reshape(B, T, H * D))

    return QuantAttention


def prepare_modelopt() -> None:
    """Import ModelOpt and register trtspec's modules and the CPU NVFP4 backend (idempotent)."""
    with quiet():
        import modelopt.torch.quantization as mtq
        from modelopt.torch.quantization.nn import QuantModuleRegistry


        if Attention not in QuantModuleRegistry:
            mtq.register(original_cls=Attention, quantized_cls=_quant_attention_cls())
        nvfp4_cpu.register()


def empty_causal_lm(args: ModelArgs, dtype: torch.dtype = torch.float32) -> CausalLM:
    """A CausalLM with uninitialised CPU weights in ``dtype`` (they are loaded right after)."""
    with torch.device("meta"):
        model = CausalLM(args).to(dtype)
    model = model.to_empty(device="cpu")
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model._rope_len = 0
    return model


def fold_weights(model: CausalLM) -> CausalLM:
    """Fake-quantize the weights once instead of on every forward (ModelOpt's ``fold_weight``:
    same numbers; weights are static at inference). Activation and KV quantizers stay active."""
    import modelopt.torch.quantization as mtq

    from modelopt.torch.quantization.nn import SequentialQuantizer

    with torch.no_grad():
        mtq.fold_weight(model)
        # ModelOpt 0.47 leaves chained weight quantizers (W4A8: INT4 blocks, then FP8) unfolded
        for mod in model.modules():
            wq = getattr(mod, "weight_quantizer", None)
            if isinstance(wq, SequentialQuantizer) and any(q.is_enabled for q in wq):
                mod.weight.data.copy_(wq(mod.weight))
                for q in wq:
                    q.disable()
    return model


def causal_lm_from_quantized(qmodel: torch.nn.Module, args: ModelArgs) -> CausalLM:
    """Rebuild a ModelOpt-quantized HF model's quantizers and weights on our CausalLM (in memory)."""
    import modelopt.torch.opt as mto

    prepare_modelopt()
    model = empty_causal_lm(args)
    w = qmodel.lm_head.weight
    with quiet():
        model = mto.restore_from_modelopt_state(model, mto.modelopt_state(qmodel))
        model.load_state_dict(qmodel.state_dict())
        # the calibrated model's dtype and device, before folding: the folded weights are then the
        # very values ModelOpt's fake-quant computes on every forward
        model = model.to(device=w.device, dtype=w.dtype)
        fold_weights(model)
    return model.eval()


def save_state(qmodel: torch.nn.Module, folder: pathlib.Path) -> pathlib.Path:
    import modelopt.torch.opt as mto

    path = folder / STATE_FILE
    with quiet():
        mto.save(qmodel, str(path))
    return path


def load_quantized(
    folder: str | os.PathLike, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    kernels: str = "native",
) -> CausalLM:
    """Load a ``trtspec quantize --export torch`` folder as a CausalLM: on native low-bit kernels
    where ``kernels="native"`` and the format has them on ``device`` (config.NATIVE_KERNELS; INT8
    and INT4 weight-only: :func:`native_weight_only`), else ModelOpt's fake-quant."""
    import modelopt.torch.opt as mto


    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise ModelError(f"quantized model folder not found: {folder}", fix="check the path")
    m = read_manifest(folder, "quantized")
    if m.get("export") != "torch":
        raise ModelError(
            f"{folder}: a '{m.get('export')}' export is for TRT-LLM, not the torch runtime",
            fix="quantize with --export torch for the torch runtime",
        )
    state = folder / STATE_FILE
    if not state.is_file():
        raise ModelError(f"{folder}: {STATE_FILE} is missing", fix="re-run trtspec quantize --export torch")
    args = ModelArgs.from_hf_config(read_hf_config(folder), where=str(folder / "config.json"))
    prepare_modelopt()
    model = empty_causal_lm(args, dtype)  # in the serving dtype from the start: one copy of the weights
    with quiet():
        model = mto.restore(model, str(state))
        model = model.to(device=device, dtype=dtype)
        dev = torch.device(device).type
        if kernels == "native" and (m.get("format"), dev) in NATIVE_KERNELS:
            native = native_weight_only(model, args)
            if native is not None:
                # ModelOpt keeps the restored model reachable after this returns: free its own
                # weights (those the native model shares stay, held by it)
                for p in model.parameters():
                    p.data = torch.empty(0, dtype=p.dtype)
                return native.to(device=device).eval()
        fold_weights(model)
    return model.eval()


@torch.no_grad()
def native_weight_only(qmodel: CausalLM, args: ModelArgs) -> CausalLM | None:
    """The ModelOpt weight-only model ``qmodel`` (restored, not folded) as a plain CausalLM on
    native kernels: INT8 per output channel (``int8_wo``) on :class:`~trtspec.speculative.model.Int8Linear`,
    INT4 in blocks of 128 (``int4_wo``, ``int4_awq`` with its activation pre-scales) on
    :class:`~trtspec.speculative.model.Int4Linear`. Built from the checkpoint's own weights and
    ranges (``amax``): the integer values are those ModelOpt's fake-quant computes with (read back
    from its output), no second quantization. A quantized LM head (``quantization.lm_head``) runs
    on its own width (INT8 under an INT4 body). None when the checkpoint quantizes anything this
    path cannot run (activations, the KV cache, other widths or blocks, a partly quantized layer,
    shapes torch's INT4 kernel refuses): the caller then keeps the fake-quant model."""
    amax: dict[str, torch.Tensor] = {}
    pqs: dict[str, torch.Tensor] = {}  # AWQ: the activations' per-channel factor
    quantized: dict[str, torch.nn.Module] = {}  # name → ModelOpt's quantized linear
    bits = set()  # the decoder layers' width (one)
    head_bits = None  # the LM head's, where quantized
    for name, mod in qmodel.named_modules():
        for q in ("output_quantizer", "k_bmm_quantizer", "v_bmm_quantizer", "q_bmm_quantizer", "p_bmm_quantizer"):
            if getattr(getattr(mod, q, None), "is_enabled", False):
                return None
        iq = getattr(mod, "input_quantizer", None)
        if getattr(iq, "is_enabled", False):
            return None
        wq = getattr(mod, "weight_quantizer", None)
        if wq is None or not wq.is_enabled:
            continue
        if wq.amax is None:
            return None
        if wq.num_bits == 8 and wq.axis == 0 and not wq.block_sizes:
            width = 8
        elif wq.num_bits == 4 and _blocks_of(wq) == INT4_GROUP:
            width = 4
        else:
            return None
        if name == "lm_head":  # quantization.lm_head: its own width (INT8 under an INT4 body)
            head_bits = width
        else:
            bits.add(width)
        amax[name] = wq.amax
        if getattr(iq, "pre_quant_scale", None) is not None:
            pqs[name] = iq.pre_quant_scale
        quantized[name] = mod
    if len(bits) != 1 or (pqs and bits != {4}):
        return None
    width = bits.pop()
    # a plain model in the checkpoint's dtype (uninitialised, then every weight from the checkpoint);
    # one layer at a time its projections get ModelOpt's own fake-quantized values, from which the
    # native linears read the integers back exactly (round(q * amax / m * m / amax) = q), and the
    # fp copies are dropped: the peak is the checkpoint plus one layer, not three copies (a 1.5B target)
    with torch.device("meta"):
        model = CausalLM(args)
    plain = model.state_dict()
    # the checkpoint's own tensors, shared (assign): no second copy of the weights
    model.load_state_dict({k: v for k, v in qmodel.state_dict().items() if k in plain}, strict=True, assign=True)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model._rope_len = 0

    def grid_of(name: str, module: torch.nn.Module) -> None:
        module.weight = torch.nn.Parameter(quantized[name].weight_quantizer(quantized[name].weight),
                                           requires_grad=False)

    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    try:
        for i, layer in enumerate(model.model.layers):
            prefix = f"model.layers.{i}."
            where = {n: f"{prefix}{'self_attn' if n[0] in 'qkvo' else 'mlp'}.{n}" for n in projections}
            if any(w not in amax for w in where.values()):  # a partly quantized layer
                return None
            ranges = {n: amax[w] for n, w in where.items()}
            for n, w in where.items():
                grid_of(w, getattr(layer.self_attn if n[0] in "qkvo" else layer.mlp, n))
            if width == 8:
                quantize_layer_weight_only_(layer.self_attn, layer.mlp, ranges)
            else:
                int4_layer_(layer.self_attn, layer.mlp, ranges, {n: pqs[w] for n, w in where.items() if w in pqs},
                            INT4_GROUP)
        if "lm_head" in amax:
            grid_of("lm_head", model.lm_head)
            model.lm_head = (Int8Linear(model.lm_head.weight, None, amax["lm_head"]) if head_bits == 8 else
                             Int4Linear(model.lm_head.weight, None, amax["lm_head"], INT4_GROUP, pqs.get("lm_head")))
    except ModelError:  # a shape torch's INT4 kernel does not take
        return None
    model.weight_only = f"int{width}"
    return model


INT4_GROUP = 128  # ModelOpt's INT4 block (int4_wo, int4_awq): input channels per scale


def _blocks_of(wq) -> int | None:
    """The block size of a weight quantizer that quantizes blocks along the input channels."""
    b = wq.block_sizes or {}
    size = b.get(-1)
    return size if size and set(b) <= {-1, "type"} and b.get("type", "static") == "static" else None
