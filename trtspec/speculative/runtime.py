"""Build a torch-runtime :class:`Engine` from plain settings (CLI, Triton model, benchmarks).

``RuntimeSpec`` is the one serialisable description of what to load; the Triton repository
stores it as JSON next to the model so the server builds exactly the engine the recipe says.
"""

from __future__ import annotations

import json
import os
import pathlib
from dataclasses import asdict, dataclass, field, replace

import torch

import importlib

from trtspec.config import SPEC_METHODS, TORCH_METHODS, draft_option_problem
from trtspec.errors import ModelError, TrtspecError
from trtspec.speculative.engine import Engine
from trtspec.speculative.loaders import loader_for
from trtspec.speculative.model import CausalLM, load_causal_lm, read_hf_config
from trtspec.speculative.proposers import DraftModelProposer, NgramProposer, Proposer
from trtspec.manifest import maybe_manifest
from trtspec.speculative.faults import FAULTS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class RuntimeSpec:
    target: str  # HF folder (or a trtspec quantized export, see load_target)
    method: str = "none"  # none | draft_target | ngram | eagle3
    draft: str | None = None  # draft model folder or EAGLE-3 head folder
    max_draft_len: int = 4
    max_matching_ngram_size: int = 3
    min_matching_ngram_size: int = 1
    dtype: str = "float32"
    device: str = "auto"
    max_batch_size: int = 8
    max_seq_len: int = 1024
    adaptive: bool = False
    adaptive_window: int = 64
    min_acceptance_rate: float | None = None
    torch_threads: int | None = None
    draft_weight_only: str = "none"  # none | int8: CausalLM / Eagle3Head .quantize_weight_only_
    compile_draft: bool = False  # draft_target: torch.compile the draft's one-token step
    extra: dict = field(default_factory=dict)

    def baseline(self) -> "RuntimeSpec":
        """The same target and runtime with ordinary decoding: the fallback deployed beside the
        speculative one. Every option that only concerns a draft is reset here, in one place."""
        return replace(self, method="none", draft=None, adaptive=False, draft_weight_only="none",
                       compile_draft=False, min_acceptance_rate=None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "RuntimeSpec":
        return cls(**json.loads(text))

    def __post_init__(self):
        if self.method not in TORCH_METHODS:
            raise TrtspecError(f"method: the torch runtime does not run {self.method!r}",
                               fix=f"use one of: {', '.join(TORCH_METHODS)}")
        if self.draft_weight_only not in ("none", "int8"):
            raise TrtspecError(f"draft_weight_only: unknown value {self.draft_weight_only!r}", fix="use none or int8")
        problem = draft_option_problem(self.method, "torch", self.draft_weight_only, self.compile_draft)
        if problem is not None:
            raise TrtspecError(f"{problem[0]}: {problem[2]}",
                               fix="drop it, or give a draft model (--draft DIR) or an EAGLE-3 head (--method eagle3 --head DIR)")

    @classmethod
    def from_recipe(cls, recipe, *, target: str | None = None, draft: str | None = None) -> "RuntimeSpec":
        """From a validated recipe; ``target``/``draft`` override the folders (e.g. quantized exports)."""
        s = recipe.speculation
        spec_model = recipe.draft_spec
        return cls(
            target=target or recipe.target.model,
            method=s.method,
            draft=draft or (spec_model.model if spec_model else None),
            max_draft_len=recipe.max_draft_len or 0,
            max_matching_ngram_size=getattr(s, "max_matching_ngram_size", 3),
            min_matching_ngram_size=getattr(s, "min_matching_ngram_size", 1),
            dtype=recipe.runtime.dtype,
            device=recipe.runtime.device,
            max_batch_size=recipe.limits.max_batch_size,
            max_seq_len=recipe.limits.max_seq_len,
            adaptive=recipe.runtime.adaptive.enabled,
            adaptive_window=recipe.runtime.adaptive.window,
            min_acceptance_rate=recipe.runtime.adaptive.min_acceptance_rate,
            torch_threads=recipe.runtime.torch_threads,
            draft_weight_only=recipe.runtime.draft_weight_only,
            compile_draft=recipe.runtime.compile_draft,
        )


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise TrtspecError("device 'cuda' requested but torch sees no CUDA device", fix="use device: cpu or auto")
    return torch.device(device)


def load_model(folder: str, dtype: torch.dtype, device: torch.device, weight_only: str = "none") -> CausalLM:
    """Load a model folder; a trtspec quantized export restores its ModelOpt state (fake-quant).
    ``weight_only="int8"`` runs the linear layers with INT8 weights (drafts only: see RuntimeSpec)."""

    m = maybe_manifest(folder) or {}
    load_quantized = loader_for(m.get("kind"), "causal_lm")
    if load_quantized is not None:  # a torch export loads; an hf/trtllm export is refused, with the fix
        if weight_only != "none":
            raise ModelError(
                f"{folder} is already quantized ({m.get('format', 'ModelOpt')}); draft_weight_only={weight_only} "
                "would quantize it twice",
                fix="set runtime.draft_weight_only: none, or point at the unquantized draft",
            )
        return load_quantized(folder, dtype=dtype, device=device)
    model = load_causal_lm(folder, dtype=dtype, device=device)
    return model.quantize_weight_only_() if weight_only == "int8" else model.fuse_()


def draft_model_proposer(spec: RuntimeSpec, target: CausalLM, dtype, device) -> Proposer:
    if not spec.draft:
        raise ModelError("draft_target needs a draft model folder", fix="set speculation.draft.model")
    # draft tokens are compared as ids, so a padded embedding (vocab_size differs, ids agree) is fine
    draft = load_model(spec.draft, dtype, device, spec.draft_weight_only)
    return DraftModelProposer(draft, spec.max_batch_size, spec.max_seq_len + spec.max_draft_len + 2,
                              compile=spec.compile_draft)


def ngram_proposer(spec: RuntimeSpec, target: CausalLM, dtype, device) -> Proposer:
    return NgramProposer(spec.max_matching_ngram_size, spec.min_matching_ngram_size, device=device)


def build_engine(spec: RuntimeSpec) -> Engine:
    if spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    dtype = DTYPES[spec.dtype]
    device = resolve_device(spec.device)
    if not os.path.isdir(spec.target):
        raise ModelError(f"target model folder not found: {spec.target}", fix="check the path")
    target = load_model(spec.target, dtype, device)
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
        max_batch_size=spec.max_batch_size,
        max_seq_len=spec.max_seq_len,
        eos_token_id=eos,
        adaptive=spec.adaptive,
        adaptive_window=spec.adaptive_window,
        min_acceptance_rate=spec.min_acceptance_rate,
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
