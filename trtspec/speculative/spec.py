"""What the torch runtime loads, as one serialisable, torch-free description.

``RuntimeSpec`` is derived from a validated recipe (:meth:`RuntimeSpec.from_recipe`); the Triton
repository stores it as JSON next to the model so the server builds exactly the engine the recipe
says (:func:`trtspec.speculative.runtime.build_engine`). Rendering a repository needs it and no
torch, so it lives here, not beside the engine builder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

from trtspec.config import TORCH_METHODS, draft_option_problem
from trtspec.errors import TrtspecError


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
    quantized_kernels: str = "native"  # native | emulated: how a ModelOpt-quantized folder runs (config.NATIVE_KERNELS)
    extra: dict = field(default_factory=dict)

    def baseline(self) -> "RuntimeSpec":
        """The same target and runtime with ordinary decoding: the fallback deployed beside the
        speculative one. Every option that only concerns a draft is reset here, in one place."""
        return replace(self, method="none", draft=None, adaptive=False, draft_weight_only="none",
                       compile_draft=False, min_acceptance_rate=None)

    def draft_alone(self) -> "RuntimeSpec":
        """The draft model decoding by itself (NVIDIA's ``tensorrt_llm_draft``: external-draft
        clients ask it for draft tokens). Its folder is served as the target, unquantized by the
        runtime (``draft_weight_only`` concerns a draft inside speculation)."""
        if self.method != "draft_target" or not self.draft:
            raise TrtspecError(f"method {self.method!r} has no draft model to serve by itself",
                               fix="only draft_target recipes have a tensorrt_llm_draft")
        return replace(self.baseline(), target=self.draft)

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
        if self.quantized_kernels not in ("native", "emulated"):
            raise TrtspecError(f"quantized_kernels: unknown value {self.quantized_kernels!r}", fix="use native or emulated")
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
            quantized_kernels=recipe.runtime.quantized_kernels,
        )
