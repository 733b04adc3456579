"""Build a torch-runtime :class:`Engine` from a :class:`~trtspec.speculative.spec.RuntimeSpec`
(CLI, Triton model, benchmarks)."""

from __future__ import annotations

import json
import os
import pathlib

import torch

import importlib

from trtspec.config import SPEC_METHODS
from trtspec.errors import ModelError, TrtspecError
from trtspec.speculative.engine import Engine
from trtspec.speculative.loaders import loader_for
from trtspec.speculative.model import CausalLM, load_causal_lm, read_hf_config
from trtspec.speculative.proposers import DraftModelProposer, NgramProposer, Proposer
from trtspec.manifest import maybe_manifest
from trtspec.speculative.faults import FAULTS
from trtspec.speculative.spec import RuntimeSpec
from trtspec.speculative.vocab import frequent_vocab

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise TrtspecError("device 'cuda' requested but torch sees no CUDA device", fix="use device: cpu or auto")
    return torch.device(device)


def load_model(folder: str, dtype: torch.dtype, device: torch.device, weight_only: str = "none",
               quantized_kernels: str = "native") -> CausalLM:
    """Load a model folder; a trtspec quantized export restores its ModelOpt state, on native
    low-bit kernels where ``quantized_kernels`` and the format allow (config.NATIVE_KERNELS), else
    fake-quant. ``weight_only="int8"`` runs an unquantized model's linear layers with INT8 weights
    (drafts only: see RuntimeSpec)."""

    m = maybe_manifest(folder) or {}
    load_quantized = loader_for(m.get("kind"), "causal_lm")
    if load_quantized is not None:  # a torch export loads; an hf/trtllm export is refused, with the fix
        if weight_only != "none":
            raise ModelError(
                f"{folder} is already quantized ({m.get('format', 'ModelOpt')}); draft_weight_only={weight_only} "
                "would quantize it twice",
                fix="set runtime.draft_weight_only: none, or point at the unquantized draft",
            )
        return load_quantized(folder, dtype=dtype, device=device, kernels=quantized_kernels)
    model = load_causal_lm(folder, dtype=dtype, device=device)
    return model.quantize_weight_only_() if weight_only == "int8" else model.fuse_()


def draft_model_proposer(spec: RuntimeSpec, target: CausalLM, dtype, device) -> Proposer:
    if not spec.draft:
        raise ModelError("draft_target needs a draft model folder", fix="set speculation.draft.model")
    # draft tokens are compared as ids, so a padded embedding (vocab_size differs, ids agree) is fine
    draft = load_model(spec.draft, dtype, device, spec.runtime.draft_weight_only, spec.runtime.quantized_kernels)
    vocab = None
    if spec.draft_vocab_size is not None:
        vocab = frequent_vocab(spec.draft, spec.draft_vocab_size, draft.args.vocab_size,
                               cfg=read_hf_config(spec.draft))
    return DraftModelProposer(draft, spec.limits.max_batch_size, spec.limits.max_seq_len + spec.max_draft_len + 2,
                              compile=spec.runtime.compile_draft, vocab=vocab)


def ngram_proposer(spec: RuntimeSpec, target: CausalLM, dtype, device) -> Proposer:
    return NgramProposer(spec.max_matching_ngram_size, spec.min_matching_ngram_size, device=device)


def build_engine(spec: RuntimeSpec) -> Engine:
    if spec.runtime.torch_threads:
        torch.set_num_threads(spec.runtime.torch_threads)
    dtype = DTYPES[spec.runtime.dtype]
    device = resolve_device(spec.runtime.device)
    if not os.path.isdir(spec.target):
        raise ModelError(f"target model folder not found: {spec.target}", fix="check the path")
    target = load_model(spec.target, dtype, device, quantized_kernels=spec.runtime.quantized_kernels)
    target.batch_invariant_(spec.runtime.batch_invariant)
    proposer = None
    if spec.method != "none":
        module, func = SPEC_METHODS[spec.method].proposer.split(":")  # the method's proposer factory
        proposer = getattr(importlib.import_module(module), func)(spec, target, dtype, device)
    eos = _eos_id(spec.target)
    verifiers = {}
    fault = spec.extra.get("fault_injection")
    if fault:

        if fault not in FAULTS:
            raise TrtspecError(f"extra.fault_injection: unknown fault {fault!r}", fix=f"one of {sorted(FAULTS)}")
        g, smp = FAULTS[fault]
        verifiers = {k: v for k, v in (("verify_greedy_fn", g), ("verify_sampled_fn", smp)) if v is not None}
    return Engine(
        target,
        proposer,
        max_draft_len=spec.max_draft_len,
        max_concurrency=spec.max_concurrency,
        max_batch_size=spec.limits.max_batch_size,
        max_seq_len=spec.limits.max_seq_len,
        eos_token_id=eos,
        adaptive=spec.runtime.adaptive.enabled,
        adaptive_window=spec.runtime.adaptive.window,
        min_acceptance_rate=spec.runtime.adaptive.min_acceptance_rate,
        policy=spec.runtime.adaptive.policy,
        **verifiers,
    )


def _eos_id(folder: str) -> int | None:
    cfg = read_hf_config(folder)
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    gen = pathlib.Path(folder) / "generation_config.json"
    if gen.is_file():
        g = json.loads(gen.read_text()).get("eos_token_id")
        if isinstance(g, list) and g:
            g = g[0]
        eos = g if g is not None else eos
    return eos
