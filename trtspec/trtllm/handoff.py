"""The build's hand-off to packaging: ``<out>/trtspec.json`` of kind ``trtllm-build``.

:class:`TrtllmBuild` is everything ``trtspec package`` needs from a TRT-LLM build, typed once:
which engines and checkpoints exist, which tokenizer and HF folders go with them, how the target
engine drafts (Triton's ``decoding_mode``, EAGLE/Medusa choices, lookahead (W, N, G)), the LLM-API
options of the PyTorch flow, parallelism, GPU placement, KV-cache shares and batch/sequence limits.
The packager reads it with :meth:`TrtllmBuild.from_build_dir` and never re-derives these values
from the recipe.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from trtspec.errors import ModelError
from trtspec.manifest import read_manifest
from trtspec.trtllm.llmapi import triton_model_yaml

KIND = "trtllm-build"
_ENVELOPE = ("kind", "trtspec_version", "created")


def triton_choices(paths: list[list[int]]) -> str:
    """[[0], [0, 1]] → "{0}, {0, 1}" (the tensorrtllm backend's eagle_choices / medusa_choices format)."""
    return ", ".join("{" + ", ".join(str(c) for c in p) + "}" for p in paths)


@dataclass(frozen=True)
class TrtllmBuild:
    """What a TRT-LLM build produced and how to serve it. Paths are absolute.

    Roles: ``target`` (the speculative engine or model), ``draft`` (draft-target), ``head``
    (EAGLE-3 head, PyTorch flow), ``baseline`` (a plain engine for the non-speculative path when
    the target engine drafts by itself: EAGLE, Medusa, lookahead).
    """

    recipe_name: str
    recipe_sha256: str
    runtime: str  # trtllm-engine | trtllm-pytorch
    method: str  # speculation method of the recipe
    trtllm_version: str  # the release the plan was generated for
    container_image: str
    out_dir: str

    # models
    tokenizer_dir: str
    hf_model_dirs: dict[str, str]  # role → original HF folder (target, draft | head)
    quantized_model_dirs: dict[str, str] = field(default_factory=dict)  # role → unified-HF export (PyTorch flow)
    checkpoint_dirs: dict[str, str] = field(default_factory=dict)  # role → TRT-LLM checkpoint (engine flow)
    engines: dict[str, str] = field(default_factory=dict)  # target | draft | baseline → engine folder

    # speculation
    max_draft_len: int = 0
    decoding_mode: str = "top_k_top_p"  # Triton tensorrtllm backend `decoding_mode` of the target model
    speculative_decoding_mode: str | None = None  # trtllm-build --speculative_decoding_mode of the target
    eagle_choices: list[list[int]] | None = None  # None: TRT-LLM's default tree (mc_sim_7b_63)
    eagle_use_dynamic_tree: bool = False
    eagle_dynamic_tree_max_top_k: int | None = None
    eagle_posterior_threshold: float | None = None
    medusa_choices: list[list[int]] | None = None
    lookahead: tuple[int, int, int] | None = None  # (W window, N ngram, G verification set)
    ngram_max_matching_size: int | None = None  # NGram V1: the client/BLS proposes, the engine verifies
    use_draft_logits: bool = False  # draft-target compares logits (engines gather generation logits)

    # PyTorch flow (LLM API)
    llm_api: dict[str, Any] | None = None  # LLM() kwargs, speculative
    llm_api_baseline: dict[str, Any] | None = None  # LLM() kwargs, plain
    llm_api_yaml: str | None = None  # trtllm-serve --extra_llm_api_options file (speculative)
    llm_api_baseline_yaml: str | None = None
    serve_command: list[str] | None = None  # trtllm-serve argv (speculative)

    # parallelism and placement
    tp_size: int = 1
    pp_size: int = 1
    world_size: int = 1
    draft_tp_size: int | None = None
    gpu_device_ids: list[int] = field(default_factory=list)
    draft_gpu_device_ids: list[int] | None = None

    # KV cache and limits
    kv_cache_free_gpu_mem_fraction: float = 0.9
    draft_kv_cache_free_gpu_mem_fraction: float = 0.1
    enable_kv_cache_reuse: bool = True
    max_batch_size: int = 1
    max_input_len: int = 1
    max_seq_len: int = 2
    max_num_tokens: int | None = None

    # provenance: stage id → content hash of what built it (empty in a plan)
    stages: dict[str, str] = field(default_factory=dict)

    # ---- serialisation

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.lookahead is not None:
            d["lookahead"] = list(self.lookahead)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrtllmBuild":
        """Inverse of :meth:`to_dict`. Accepts a whole manifest (its envelope keys are skipped);
        an unknown or missing field is an error, not a guess."""
        names = {f.name for f in dataclasses.fields(cls)}
        body = {k: v for k, v in data.items() if k not in _ENVELOPE}
        unknown = sorted(set(body) - names)
        if unknown:
            raise ModelError(
                f"trtllm-build manifest has unknown field(s) {', '.join(unknown)}",
                fix="it was written by another trtspec version: rebuild with `trtspec build`",
            )
        required = {f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        missing = sorted(required - set(body))
        if missing:
            raise ModelError(f"trtllm-build manifest lacks field(s) {', '.join(missing)}",
                             fix="rebuild with `trtspec build`")
        if body.get("lookahead") is not None:
            body["lookahead"] = tuple(body["lookahead"])
        return cls(**body)

    @classmethod
    def from_build_dir(cls, folder: str | os.PathLike) -> "TrtllmBuild":
        """Read ``<folder>/trtspec.json`` written by ``trtspec build``."""
        return cls.from_dict(read_manifest(folder, kind=KIND))

    # ---- views for the packager

    def triton_parameters(self, role: str = "target") -> dict[str, Any]:
        """The tensorrtllm backend ``config.pbtxt`` parameters for one engine (engine flow):
        ``target`` gets the speculative decoding settings, ``draft`` and ``baseline`` decode plainly.
        Values are strings or numbers as the backend reads them; None = leave the default."""
        if role not in self.engines:
            raise ModelError(f"this build has no {role!r} engine (engines: {', '.join(self.engines) or 'none'})")
        draft = role == "draft"
        ids = self.draft_gpu_device_ids if draft else self.gpu_device_ids
        params: dict[str, Any] = {
            "gpt_model_path": self.engines[role],
            "kv_cache_free_gpu_mem_fraction": (
                self.kv_cache_free_gpu_mem_fraction if role == "target" else self.draft_kv_cache_free_gpu_mem_fraction
            ),
            "enable_kv_cache_reuse": self.enable_kv_cache_reuse,
            "gpu_device_ids": ",".join(str(i) for i in ids) if ids else None,
            "decoding_mode": self.decoding_mode if role == "target" else "top_k_top_p",
        }
        if role == "target":
            if self.decoding_mode == "eagle":
                params["eagle_choices"] = triton_choices(self.eagle_choices) if self.eagle_choices else None
            elif self.decoding_mode == "medusa":
                params["medusa_choices"] = triton_choices(self.medusa_choices) if self.medusa_choices else None
            elif self.decoding_mode == "lookahead" and self.lookahead:
                w, n, g = self.lookahead
                params.update(lookahead_window_size=w, lookahead_ngram_size=n, lookahead_verification_set_size=g)
        return params

    def triton_model_yaml(self, *, decoupled: bool, baseline: bool = False) -> dict[str, Any]:
        """Triton llmapi ``model.yaml`` (PyTorch flow) for the speculative or the baseline model."""

        opts = self.llm_api_baseline if baseline else self.llm_api
        if opts is None:
            raise ModelError(f"this build ({self.runtime}) has no LLM-API options; it is not a trtllm-pytorch build")
        return triton_model_yaml(opts, decoupled=decoupled)
