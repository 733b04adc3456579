"""Quantizing an EAGLE-3 head on its own (the target stays as it is).

The head (``trtspec.speculative.eagle3.Eagle3Head``: ``fc`` + one decoder layer + ``norm``; the
target's embedding and LM head are shared, not its own) is quantized by ModelOpt directly, as
ModelOpt quantizes ``eagle_module`` inside its own EAGLE model: its linears (``fc``,
``q/k/v/o_proj``, the MLP) and, with a KV-cache format, its attention's K/V. Calibration runs the
*target* over the calibration text and feeds the head the target's aux-layer features,
teacher-forced, exactly as at draft time for positions with target features.

Exports:

* ``hf``: the layout ModelOpt's ``export_speculative_decoding`` writes for a quantized EAGLE
  draft (``config.json`` + ``quantization_config``, ``hf_quant_config.json``,
  ``model.safetensors`` with e.g. FP8 ``weight`` + ``weight_scale`` / ``input_scale``, and the
  unquantized copy of the target's ``lm_head``), built with ModelOpt's own per-module packers;
* ``torch``: ModelOpt's restorable state, loaded by :func:`load_quantized_head`.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import shutil

import torch
import torch.nn.functional as F

from trtspec.errors import ModelError
from trtspec.speculative.model import CausalLM
from trtspec.speculative.eagle3 import load_eagle3_head
from trtspec.quantize.runtime import fold_weights, prepare_modelopt, quiet
from trtspec.manifest import read_manifest
from trtspec.speculative.eagle3 import Eagle3Head, HeadConfig
from trtspec.speculative.model import read_hf_config
from trtspec.speculative.eagle3 import Eagle3Proposer
from trtspec.speculative.engine import Engine
from trtspec.sampling import Sampling

STATE_FILE = "modelopt_state.pth"


def load_head(head_dir: pathlib.Path, target: CausalLM, dtype: torch.dtype, device: torch.device):

    return load_eagle3_head(head_dir, target, dtype=dtype, device=device)


def features(target: CausalLM, head, x: torch.Tensor) -> torch.Tensor:
    """The head's input feature at every position of ``x [B, T]``: fc(concat(aux layer outputs))."""
    _, hidden, _ = target(x, None, logits="none", hidden_layers=head.aux_layers)
    return head.fc(torch.cat(hidden, -1))  # [B, T, H]


def teacher_forced_logits(target: CausalLM, head, x: torch.Tensor) -> torch.Tensor:
    """Step-0 draft logits ``[B, T-2, V]``: position j (target features up to j, token j+1)
    predicts token j+2."""
    g = head(features(target, head, x), x.roll(-1, 1), None)  # [B, T, H]
    return head.logits(g[:, :-2])


def calibrate(head, target: CausalLM, cfg: dict, ids: torch.Tensor, batch: int, progress=None):
    import modelopt.torch.quantization as mtq

    n = ids.shape[0]

    def forward_loop(h) -> None:
        for i in range(0, n, batch):
            x = ids[i : i + batch]
            h(features(target, h, x), x.roll(-1, 1), None)
            if progress:
                progress("calibrate", min(i + batch, n), n, {})

    with torch.inference_mode(False), torch.no_grad():
        return mtq.quantize(head, cfg, forward_loop)


def export_hf(qhead, tmp: pathlib.Path, head_dir: pathlib.Path) -> dict:
    """The unified HF layout of a quantized EAGLE draft (see the module docstring)."""
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format
    from modelopt.torch.export.quant_utils import get_quant_config, postprocess_state_dict
    from modelopt.torch.export.unified_export_hf import _process_quantized_modules
    from safetensors.torch import save_file

    head = copy.deepcopy(qhead)  # packing real-quantizes weights in place
    qc = get_quant_config(head)
    # the copy of the target's LM head stays unquantized, as in ModelOpt's EAGLE export
    qc["quantization"]["exclude_modules"] = sorted(set(qc["quantization"].get("exclude_modules") or []) | {"lm_head"})
    dtype = head.fc.weight.dtype
    with torch.inference_mode():
        _process_quantized_modules(head, dtype)
        state = postprocess_state_dict(head.state_dict(), 448, qc["quantization"].get("kv_cache_quant_algo"))
    state = {k: v.detach().contiguous() for k, v in state.items()}
    state["lm_head.weight"] = qhead._shared[1].weight.detach().to(dtype).contiguous()
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((head_dir / "config.json").read_text())
    cfg["quantization_config"] = convert_hf_quant_config_format(qc)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (tmp / "hf_quant_config.json").write_text(json.dumps(qc, indent=2) + "\n")
    return {"quant_algo": qc["quantization"].get("quant_algo"),
            "kv_cache_quant_algo": qc["quantization"].get("kv_cache_quant_algo"),
            "consumers": ["trtllm-pytorch speculative_model (Eagle3DecodingConfig)"]}


def export_torch(qhead, tmp: pathlib.Path, head_dir: pathlib.Path) -> dict:
    import modelopt.torch.opt as mto

    mto.save(qhead, str(tmp / STATE_FILE))
    shutil.copy2(head_dir / "config.json", tmp / "config.json")
    return {"consumers": ["trtspec torch runtime (trtspec.quantize.eagle3_head.load_quantized_head)"]}


def head_from_quantized(qhead, target: CausalLM, head_dir: pathlib.Path):
    """A fresh head with ``qhead``'s quantizers and weights, weights folded (as loaded from disk)."""
    import modelopt.torch.opt as mto


    prepare_modelopt()
    w = qhead.fc.weight
    head = load_head(head_dir, target, w.dtype, w.device)
    with quiet():
        head = mto.restore_from_modelopt_state(head, mto.modelopt_state(qhead))
        head.load_state_dict(qhead.state_dict())
        fold_weights(head)
    return head.eval()


def load_quantized_head(folder: str | os.PathLike, target: CausalLM, *, dtype: torch.dtype | None = None,
                        device: str | torch.device | None = None):
    """Load a ``trtspec quantize --export torch`` EAGLE-3 head for ``target`` (fake-quant)."""
    import modelopt.torch.opt as mto


    folder = pathlib.Path(folder)
    m = read_manifest(folder, "quantized")
    if m.get("export") != "torch" or m.get("role") != "eagle3_head":
        raise ModelError(f"{folder}: not a torch export of an EAGLE-3 head (export={m.get('export')!r}, "
                         f"role={m.get('role')!r})", fix="quantize the head with --export torch")
    cfg = HeadConfig.from_hf_config(read_hf_config(folder), where=str(folder / "config.json"),
                                    feature_norm=m.get("feature_norm", "standard"))
    if cfg.layer.hidden_size != target.args.hidden_size or cfg.layer.vocab_size != target.args.vocab_size:
        raise ModelError(f"{folder}: the head was quantized for another target (hidden/vocab size differ)",
                         fix="load it with the target it was quantized for: " + str(m.get("target", {}).get("path")))
    prepare_modelopt()
    head = Eagle3Head(cfg, target.model.embed_tokens, target.lm_head)
    w = target.lm_head.weight
    with quiet():
        head = mto.restore(head, str(folder / STATE_FILE))
        head = head.to(device=device or w.device, dtype=dtype or w.dtype)
        fold_weights(head)
    return head.eval()


@torch.inference_mode()
def compare_head_logits(target: CausalLM, base, quant, windows: torch.Tensor, *, batch_size: int = 4) -> dict:
    """Teacher-forced step-0 draft distributions of ``quant`` against ``base`` (and the true
    next-next tokens for perplexity) on held-out ``windows [N, L]``."""
    n_tok = agree = 0
    kl = nll_b = nll_q = 0.0
    for i in range(0, windows.shape[0], batch_size):
        x = windows[i : i + batch_size]
        tgt = x[:, 2:]
        lp_b = F.log_softmax(teacher_forced_logits(target, base, x).float(), -1)
        lp_q = F.log_softmax(teacher_forced_logits(target, quant, x).float(), -1)
        agree += int((lp_b.argmax(-1) == lp_q.argmax(-1)).sum())
        kl += float((lp_b.exp() * (lp_b - lp_q)).sum())
        nll_b -= float(lp_b.gather(-1, tgt[..., None]).sum())
        nll_q -= float(lp_q.gather(-1, tgt[..., None]).sum())
        n_tok += tgt.numel()
    import math

    ppl_b, ppl_q = math.exp(nll_b / n_tok), math.exp(nll_q / n_tok)
    return {"tokens": n_tok, "top1_agreement": agree / n_tok, "kl_divergence": kl / n_tok,
            "perplexity_base": ppl_b, "perplexity_quantized": ppl_q,
            "perplexity_change_pct": 100.0 * (ppl_q / ppl_b - 1.0)}


def head_acceptance(target: CausalLM, base, quant, prompts: list[list[int]], s) -> dict:
    """EAGLE-3 acceptance against the (unquantized) target before/after quantizing the head."""

    out: dict = {"quantized": "eagle3_head"}
    max_seq_len = max(len(p) for p in prompts) + s.max_new_tokens + 1
    for name, head in (("before", base), ("after", quant)):
        prop = Eagle3Proposer(head, s.batch_size, max_seq_len + s.max_draft_len + 2)
        eng = Engine(target, prop, max_draft_len=s.max_draft_len, max_batch_size=s.batch_size, max_seq_len=max_seq_len)
        gens = eng.generate(prompts, Sampling(max_tokens=s.max_new_tokens, ignore_eos=True))
        drafted, accepted = sum(g.stats.drafted for g in gens), sum(g.stats.accepted for g in gens)
        steps = sum(g.stats.steps for g in gens)
        out[name] = {"drafted": drafted, "accepted": accepted,
                     "acceptance_rate": accepted / drafted if drafted else None,
                     "acceptance_length": (accepted + steps) / steps if steps else None}
    b, a = out["before"]["acceptance_rate"], out["after"]["acceptance_rate"]
    out["acceptance_rate_change"] = (a - b) if a is not None and b is not None else None
    return out
