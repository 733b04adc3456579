"""What the torch runtime loads, as one serialisable, torch-free description.

``RuntimeSpec`` is derived from a validated recipe (:meth:`RuntimeSpec.from_recipe`); the Triton
repository stores it as JSON next to the model so the server builds exactly the engine the recipe
says (:func:`trtspec.speculative.runtime.build_engine`). Rendering a repository needs it and no
torch, so it lives here, not beside the engine builder.

Its runtime options and limits are the recipe's own typed sections, cut to what the torch engine
reads (:class:`TorchRuntime` of ``runtime``, :class:`TorchLimits` of ``limits``: same fields,
bounds and descriptions, declared once in ``trtspec.config``), so a recipe option reaches the
engine without a second list of fields to keep in step.

JSON: ``{"version": 2, "target", "method", "draft", ..., "runtime": {...}, "limits": {...}}``.
Repositories rendered before version 2 hold the same values flat (``dtype``, ``adaptive``,
``adaptive_window``, ``max_batch_size`` ...); :meth:`RuntimeSpec.from_json` reads both, and refuses
a newer version by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from pydantic import ValidationError

from trtspec.config import TORCH_METHODS, Adaptive, Limits, RuntimeConfig, draft_option_problem, section_errors, section_subset
from trtspec.errors import ConfigErrors, TrtspecError

SPEC_VERSION = 2

# The engine's defaults differ from a recipe's in one place: adaptive drafting is off unless asked for.
TorchRuntime = section_subset(
    "TorchRuntime", RuntimeConfig,
    ("dtype", "device", "torch_threads", "draft_weight_only", "compile_draft", "quantized_kernels", "batch_invariant",
     "adaptive"),
    adaptive=Adaptive(enabled=False))
TorchLimits = section_subset("TorchLimits", Limits, ("max_batch_size", "max_seq_len"))

# version 1 (flat) key → (section, key[, adaptive key]) of version 2
_FLAT_V1 = {
    "dtype": ("runtime", "dtype"), "device": ("runtime", "device"), "torch_threads": ("runtime", "torch_threads"),
    "draft_weight_only": ("runtime", "draft_weight_only"), "compile_draft": ("runtime", "compile_draft"),
    "quantized_kernels": ("runtime", "quantized_kernels"), "adaptive": ("runtime", "adaptive", "enabled"),
    "adaptive_window": ("runtime", "adaptive", "window"),
    "min_acceptance_rate": ("runtime", "adaptive", "min_acceptance_rate"),
    "max_batch_size": ("limits", "max_batch_size"), "max_seq_len": ("limits", "max_seq_len"),
}


def _section(cls, value, name: str):
    if isinstance(value, cls):
        return value
    try:
        return cls.model_validate(value)
    except ValidationError as exc:
        raise ConfigErrors(section_errors(exc), f"RuntimeSpec.{name}") from None


@dataclass
class RuntimeSpec:
    target: str  # HF folder (or a trtspec quantized export, see load_target)
    method: str = "none"  # none | draft_target | ngram | eagle3
    draft: str | None = None  # draft model folder or EAGLE-3 head folder
    max_draft_len: int = 4
    max_concurrency: int | None = None  # speculation.max_concurrency: no drafting above this many requests
    draft_vocab_size: int | None = None  # speculation.draft_vocab_size: the draft scores only this many tokens
    max_matching_ngram_size: int = 3
    min_matching_ngram_size: int = 1
    runtime: TorchRuntime = field(default_factory=TorchRuntime)  # the recipe's runtime section, torch part
    limits: TorchLimits = field(default_factory=TorchLimits)  # the recipe's limits the engine sizes its cache by
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.runtime = _section(TorchRuntime, self.runtime, "runtime")
        self.limits = _section(TorchLimits, self.limits, "limits")
        if self.method not in TORCH_METHODS:
            raise TrtspecError(f"method: the torch runtime does not run {self.method!r}",
                               fix=f"use one of: {', '.join(TORCH_METHODS)}")
        problem = draft_option_problem(self.method, "torch", self.runtime.draft_weight_only, self.runtime.compile_draft)
        if problem is not None:
            raise TrtspecError(f"{problem[0]}: {problem[2]}",
                               fix="drop it, or give a draft model (--draft DIR) or an EAGLE-3 head (--method eagle3 --head DIR)")

    def _runtime_with(self, changes: dict):
        if isinstance(changes.get("adaptive"), dict):
            changes = {**changes, "adaptive": self.runtime.adaptive.model_copy(update=changes["adaptive"])}
        return self.runtime.model_copy(update=changes)

    def with_runtime(self, **changes) -> "RuntimeSpec":
        """A copy with runtime options changed (``adaptive=`` takes Adaptive fields as a dict)."""
        return replace(self, runtime=self._runtime_with(changes))

    def with_limits(self, **changes) -> "RuntimeSpec":
        return replace(self, limits=self.limits.model_copy(update=changes))

    def baseline(self) -> "RuntimeSpec":
        """The same target and runtime with ordinary decoding: the fallback deployed beside the
        speculative one. Every option that only concerns a draft is reset here, in one place."""
        return replace(self, method="none", draft=None, max_concurrency=None, draft_vocab_size=None, runtime=self._runtime_with(
            {"adaptive": {"enabled": False, "min_acceptance_rate": None}, "draft_weight_only": "none",
             "compile_draft": False}))

    def to_dict(self) -> dict:
        return {"version": SPEC_VERSION, "target": self.target, "method": self.method, "draft": self.draft,
                "max_draft_len": self.max_draft_len, "max_concurrency": self.max_concurrency,
                "draft_vocab_size": self.draft_vocab_size,
                "max_matching_ngram_size": self.max_matching_ngram_size,
                "min_matching_ngram_size": self.min_matching_ngram_size, "runtime": self.runtime.model_dump(),
                "limits": self.limits.model_dump(), "extra": self.extra}

    def draft_alone(self) -> "RuntimeSpec":
        """The draft model decoding by itself (NVIDIA's ``tensorrt_llm_draft``: external-draft
        clients ask it for draft tokens). Its folder is served as the target, unquantized by the
        runtime (``draft_weight_only`` concerns a draft inside speculation)."""
        if self.method != "draft_target" or not self.draft:
            raise TrtspecError(f"method {self.method!r} has no draft model to serve by itself",
                               fix="only draft_target recipes have a tensorrt_llm_draft")
        return replace(self.baseline(), target=self.draft)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "RuntimeSpec":
        d = json.loads(text)
        version = d.pop("version", 1)
        if version == 1:  # rendered before the runtime options were the recipe's sections
            nested: dict = {"runtime": {}, "limits": {}}
            for key, (section, *path) in _FLAT_V1.items():
                if key in d:
                    node = nested[section]
                    for k in path[:-1]:
                        node = node.setdefault(k, {})
                    node[path[-1]] = d.pop(key)
            d.update(nested)
        elif version != SPEC_VERSION:
            raise TrtspecError(f"runtime_spec.json: version {version!r} is not one this trtspec reads "
                               f"(1 and {SPEC_VERSION})",
                               fix="render the repository again with this trtspec (trtspec package / trtspec run)")
        return cls(**d)

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
            max_concurrency=getattr(s, "max_concurrency", None),
            draft_vocab_size=getattr(s, "draft_vocab_size", None),
            max_matching_ngram_size=getattr(s, "max_matching_ngram_size", 3),
            min_matching_ngram_size=getattr(s, "min_matching_ngram_size", 1),
            runtime=recipe.runtime.model_dump(include=set(TorchRuntime.model_fields)),
            limits=recipe.limits.model_dump(include=set(TorchLimits.model_fields)),
        )
