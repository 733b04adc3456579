"""The deployment recipe: one strict, typed config tree (``build_configs/*.yaml``).

Unknown keys are errors; every error names the dotted field, the bad value and what is allowed.
The speculation method is a discriminated union on ``speculation.method``: one class per method,
each validating its own fields (TRT-LLM's LLM-API configs are the model; unlike them, nothing
here silently rewrites a user value).

Relative paths in a recipe are resolved against the recipe file's folder.
"""

from __future__ import annotations

import pathlib
import re
from typing import Annotated, Any, ClassVar, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from trtspec.errors import ConfigError, ConfigErrors
from trtspec.hub import PREFIX, is_hub_id
from trtspec.passthrough import check_llm_api_options
from trtspec.passthrough import check_build_args
from trtspec.passthrough import check_tritonserver_args
from trtspec.calib_sources import NAMED
from trtspec.calib_sources import is_hub_id as is_dataset_id
from trtspec.calib_sources import default_sizes
from trtspec.calib_sources import bare_word_problem

QuantFormat = Literal["none", "fp8", "int8_sq", "int8_wo", "int4_wo", "int4_awq", "w4a8_awq", "nvfp4"]
KVCacheFormat = Literal["none", "fp8", "int8"]
Runtime = Literal["torch", "trtllm-engine", "trtllm-pytorch"]
Dtype = Literal["float32", "bfloat16", "float16"]
GpuArch = Literal["any", "ampere", "ada", "hopper", "blackwell"]

class Strict(BaseModel):
    """Base for every config node: unknown keys are errors, values are not coerced across types."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# --------------------------------------------------------------------------------------------
# models and quantization


class Calibration(Strict):
    """Calibration data for ModelOpt PTQ (sources: trtspec.calib_sources, docs/quantization.md).

    ``size`` x ``seq_len`` default to ModelOpt's 512 x 512, or 64 x 128 for ``builtin`` (the CPU
    tiny recipes)."""

    dataset: str = Field(
        "builtin",
        description="builtin (stdlib source, tiny CPU recipes) | cnn_dailymail | pileval | a Hugging Face dataset "
        "id org/name | a local dataset folder (save_to_disk, or a train split) | a .jsonl/.txt file",
    )
    split: str | None = Field(None, description="dataset split (default: the named dataset's, else train)")
    column: str | None = Field(None, description="text column (default: the named dataset's, else text)")
    size: int = Field(512, ge=1, le=100_000, description="number of calibration sequences (64 for builtin)")
    seq_len: int = Field(512, ge=8, le=32_768, description="tokens per calibration sequence (128 for builtin)")

    @model_validator(mode="before")
    @classmethod
    def _default_sizes(cls, data: Any) -> Any:

        if isinstance(data, dict):
            size, seq_len = default_sizes(data.get("dataset", "builtin"))
            data = {"size": size, "seq_len": seq_len, **data}
        return data

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:

        problem = bare_word_problem(v)
        if problem:
            raise ValueError(f"{problem}; use builtin, cnn_dailymail, pileval, org/name, or a path (./NAME for a "
                             "folder here)")
        return v


class Quantization(Strict):
    format: QuantFormat = "none"
    kv_cache: KVCacheFormat = "none"
    lm_head: Literal["none", "int8_wo"] = Field(
        "none",
        description="torch export only: also quantize the LM head, INT8 weight-only per output channel "
        "(ModelOpt's formats leave it unquantized; llama.cpp's Q4_K_M keeps it at 6 bits). On a 1.5B target with "
        "a 150k vocabulary the bf16 head is a third of a decode step; INT8 halves its bytes and, on torch's "
        "INT8 kernel, gives every row the same bits in any batch (see runtime.batch_invariant)",
    )
    calibration: Calibration = Calibration()
    force: bool = Field(False, description="build even a combination known to fail upstream")


class ModelSpec(Strict):
    """A model checkpoint: an HF folder (``config.json`` + safetensors + tokenizer), or a Hugging
    Face hub id resolved through the local cache (trtspec.hub)."""

    model: str = Field(..., min_length=1, description="HF checkpoint folder (local path), or a hub id org/name "
                       "(hf://org/name) resolved through huggingface_hub's cache")
    tokenizer: str | None = Field(None, description="tokenizer folder (or hub id) if not beside the weights")
    revision: str | None = Field(None, min_length=1, description="hub id only: branch, tag or commit to pin")
    quantization: Quantization = Quantization()


# --------------------------------------------------------------------------------------------
# speculation methods: one class per method, selected by the literal ``method``
#
# Each class owns its fields and its capabilities, as class variables:
#   runtimes        which runtimes run it (reference/trtllm-triton.md §0.2, §1.3, §1.4). The torch
#                   runtime is ours: it runs what a draft model, an EAGLE-3 head or the prompt can
#                   propose. Medusa, lookahead and EAGLE-1/2 are TRT-engine only; EAGLE-3, NGram V2 and
#                   DraftTarget are PyTorch-flow in TRT-LLM; MTP needs MTP layers.
#   int8_draft      runtime.draft_weight_only can run its draft (model or head) on INT8 kernels
#   compiles_draft  runtime.compile_draft can torch.compile its draft's one-token step
#   proposer        "module:function" that makes its torch-runtime proposer (imported when used)
# SPEC_METHODS (below the classes) is the one table everything reads: the recipe's checks, the
# CLI's choices, the torch runtime and the renderer.


class _SwitchesOff(Strict):
    """What the methods that run in trtspec's torch runtime and TRT-LLM's PyTorch flow share."""

    max_concurrency: int | None = Field(
        None, ge=1,
        description="speculate only while at most this many requests are being decoded; above it every step is "
        "ordinary decoding (TRT-LLM's speculative_config.max_concurrency, PyTorch flow; the torch runtime does the "
        "same). Where the target's weights are read once per step, as on a CPU or a memory-bound GPU, several "
        "plain rows share that read and speculation stops paying at some concurrency: `trtspec run` reports the "
        "speedup per concurrency level. None: always speculate",
    )


class NoSpeculation(Strict):
    """Ordinary autoregressive decoding (the baseline)."""

    method: Literal["none"]
    runtimes: ClassVar[tuple[str, ...]] = ("torch", "trtllm-engine", "trtllm-pytorch")
    int8_draft: ClassVar[bool] = False
    compiles_draft: ClassVar[bool] = False
    proposer: ClassVar[str | None] = None


class DraftTarget(_SwitchesOff):
    """A separate, smaller draft model proposes ``max_draft_len`` tokens; the target verifies."""

    method: Literal["draft_target"]
    runtimes: ClassVar[tuple[str, ...]] = ("torch", "trtllm-engine", "trtllm-pytorch")
    int8_draft: ClassVar[bool] = True
    compiles_draft: ClassVar[bool] = True
    proposer: ClassVar[str | None] = "trtspec.speculative.runtime:draft_model_proposer"
    draft: ModelSpec
    max_draft_len: int = Field(4, ge=1, le=32)
    # TRT-LLM engine flow: compare draft logits (rejection sampling) instead of draft tokens.
    use_draft_logits: bool = False
    draft_vocab_size: int | None = Field(
        None, ge=64, multiple_of=64,
        description="torch runtime: the draft scores only this many target tokens, the most frequent in trtspec's "
        "code corpus under the draft's tokenizer (FR-Spec; EAGLE-3's draft vocabulary), so its LM head reads a "
        "fraction of its bytes per drafted token. Lossless: the target verifies every token, and one outside the "
        "cut is never proposed. A multiple of 64. None: the whole vocabulary",
    )


class Eagle(Strict):
    """EAGLE-1/2 head (TRT-LLM engine flow only): a static choices tree or EAGLE-2 dynamic tree."""

    method: Literal["eagle"]
    runtimes: ClassVar[tuple[str, ...]] = ("trtllm-engine",)
    int8_draft: ClassVar[bool] = False
    compiles_draft: ClassVar[bool] = False
    proposer: ClassVar[str | None] = None
    head: ModelSpec
    max_draft_len: int = Field(63, ge=1, le=256)  # tree size; convert_checkpoint asserts <= 256
    num_eagle_layers: int = Field(4, ge=1, le=16)  # maximum depth of the choices tree
    max_non_leaves_per_layer: int = Field(10, ge=1, le=256)
    eagle_choices: list[list[int]] | None = Field(
        None, description="static tree, e.g. [[0],[0,0],[1]]; None = TRT-LLM's default mc_sim_7b_63"
    )
    use_dynamic_tree: bool = False  # EAGLE-2
    dynamic_tree_max_top_k: int = Field(10, ge=1, le=64)
    posterior_threshold: float | None = Field(None, gt=0, lt=1, description="typical acceptance")
    modelopt_checkpoint: bool = Field(
        False,
        description="head.model is one ModelOpt unified checkpoint (base + eagle_module, config.json 'eagle' "
        "block); converted alone, without --eagle_model_dir",
    )

    @model_validator(mode="after")
    def _tree(self) -> "Eagle":
        if self.eagle_choices is None:
            return self
        if not self.eagle_choices:
            raise ValueError("eagle_choices: must not be empty; omit it to use the default tree")
        seen = set()
        for path in self.eagle_choices:
            if not path or any(c < 0 for c in path):
                raise ValueError(f"eagle_choices: path {path} must be a non-empty list of child indices >= 0")
            t = tuple(path)
            if t in seen:
                raise ValueError(f"eagle_choices: path {path} appears twice")
            seen.add(t)
        for t in seen:
            if len(t) > 1 and t[:-1] not in seen:
                raise ValueError(f"eagle_choices: path {list(t)} has no parent {list(t[:-1])} in the tree")
        depth = max(len(p) for p in self.eagle_choices)
        if depth > self.num_eagle_layers:
            raise ValueError(
                f"eagle_choices: tree depth {depth} exceeds num_eagle_layers={self.num_eagle_layers}; "
                f"raise num_eagle_layers to {depth} or prune the tree"
            )
        if len(self.eagle_choices) > self.max_draft_len:
            raise ValueError(
                f"eagle_choices: {len(self.eagle_choices)} nodes exceed max_draft_len={self.max_draft_len}; "
                f"set max_draft_len >= {len(self.eagle_choices)}"
            )
        by_depth: dict[int, set[tuple[int, ...]]] = {}
        for t in seen:
            if len(t) > 1:
                by_depth.setdefault(len(t) - 1, set()).add(t[:-1])
        for d, parents in by_depth.items():
            if len(parents) > self.max_non_leaves_per_layer:
                raise ValueError(
                    f"eagle_choices: layer {d} has {len(parents)} non-leaf nodes, more than "
                    f"max_non_leaves_per_layer={self.max_non_leaves_per_layer}"
                )
        return self


class Eagle3(_SwitchesOff):
    """EAGLE-3 head: features from the target's low/mid/high hidden states + token embeddings,
    one decoder layer, the target's LM head or its own over a draft vocabulary (the head's
    ``draft_vocab_size`` and ``d2t``). Torch runtime and TRT-LLM PyTorch flow."""

    method: Literal["eagle3"]
    runtimes: ClassVar[tuple[str, ...]] = ("torch", "trtllm-pytorch")
    int8_draft: ClassVar[bool] = True
    compiles_draft: ClassVar[bool] = False
    proposer: ClassVar[str | None] = "trtspec.speculative.eagle3:eagle3_proposer"
    head: ModelSpec
    max_draft_len: int = Field(4, ge=1, le=32)
    use_dynamic_tree: bool = False
    dynamic_tree_max_top_k: int = Field(10, ge=1, le=64)
    max_total_draft_tokens: int | None = Field(None, ge=1, le=1024)
    eagle3_one_model: bool = True

    @model_validator(mode="after")
    def _dynamic_tree(self) -> "Eagle3":
        if self.max_total_draft_tokens is not None:
            lo, hi = self.max_draft_len, self.dynamic_tree_max_top_k * self.max_draft_len
            if not self.use_dynamic_tree and self.max_total_draft_tokens != self.max_draft_len:
                raise ValueError(
                    f"max_total_draft_tokens: a linear (non-tree) draft has exactly max_draft_len="
                    f"{self.max_draft_len} tokens; set use_dynamic_tree: true or drop the field"
                )
            if not lo <= self.max_total_draft_tokens <= hi:
                raise ValueError(
                    f"max_total_draft_tokens: must satisfy max_draft_len <= max_total_draft_tokens <= "
                    f"dynamic_tree_max_top_k * max_draft_len, i.e. {lo}..{hi}"
                )
        return self


class NGram(_SwitchesOff):
    """Prompt lookup: match the last n tokens against the prompt and generated text."""

    method: Literal["ngram"]
    runtimes: ClassVar[tuple[str, ...]] = ("torch", "trtllm-engine", "trtllm-pytorch")
    int8_draft: ClassVar[bool] = False
    compiles_draft: ClassVar[bool] = False
    proposer: ClassVar[str | None] = "trtspec.speculative.runtime:ngram_proposer"
    max_draft_len: int = Field(4, ge=1, le=32)
    max_matching_ngram_size: int = Field(3, ge=1, le=16)
    min_matching_ngram_size: int = Field(1, ge=1, le=16)

    @model_validator(mode="after")
    def _sizes(self) -> "NGram":
        if self.min_matching_ngram_size > self.max_matching_ngram_size:
            raise ValueError(
                f"min_matching_ngram_size={self.min_matching_ngram_size} is larger than "
                f"max_matching_ngram_size={self.max_matching_ngram_size}"
            )
        return self


class Medusa(Strict):
    """Medusa heads (TRT-LLM engine flow only; greedy only)."""

    method: Literal["medusa"]
    runtimes: ClassVar[tuple[str, ...]] = ("trtllm-engine",)
    int8_draft: ClassVar[bool] = False
    compiles_draft: ClassVar[bool] = False
    proposer: ClassVar[str | None] = None
    head: ModelSpec
    num_medusa_heads: int = Field(4, ge=1, le=16)
    max_draft_len: int = Field(63, ge=1, le=256)
    medusa_choices: list[list[int]] | None = None

    @model_validator(mode="after")
    def _choices(self) -> "Medusa":
        if self.medusa_choices is not None:
            depth = max((len(p) for p in self.medusa_choices), default=0)
            if depth > self.num_medusa_heads:
                raise ValueError(
                    f"medusa_choices: depth {depth} exceeds num_medusa_heads={self.num_medusa_heads}"
                )
            if len(self.medusa_choices) > self.max_draft_len:
                raise ValueError(
                    f"medusa_choices: {len(self.medusa_choices)} nodes exceed max_draft_len={self.max_draft_len}"
                )
        return self


def lookahead_max_draft_len(window_size: int, ngram_size: int, verification_set_size: int) -> int:
    """TRT-LLM's lookahead draft length for (W, N, G): (0 if N == 1 else N-2) + (W-1+G)(N-1)."""
    w, n, g = window_size, ngram_size, verification_set_size
    return (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)


class Lookahead(Strict):
    """Lookahead decoding (Jacobi + n-gram pool; TRT-LLM engine flow only)."""

    method: Literal["lookahead"]
    runtimes: ClassVar[tuple[str, ...]] = ("trtllm-engine",)
    int8_draft: ClassVar[bool] = False
    compiles_draft: ClassVar[bool] = False
    proposer: ClassVar[str | None] = None
    window_size: int = Field(4, ge=1, le=64)  # W
    ngram_size: int = Field(3, ge=1, le=64)  # N
    verification_set_size: int = Field(4, ge=1, le=64)  # G
    max_draft_len: int | None = Field(
        None, description="must equal (N-2) + (W-1+G)(N-1); omit to have it checked, not guessed"
    )

    @model_validator(mode="after")
    def _formula(self) -> "Lookahead":
        want = lookahead_max_draft_len(self.window_size, self.ngram_size, self.verification_set_size)
        if self.max_draft_len is not None and self.max_draft_len != want:
            raise ValueError(
                f"max_draft_len={self.max_draft_len} does not match lookahead (W={self.window_size}, "
                f"N={self.ngram_size}, G={self.verification_set_size}): (N-2) + (W-1+G)(N-1) = {want}; "
                f"set max_draft_len: {want} (the engine and executor_lookahead_config must agree)"
            )
        return self

    @property
    def effective_max_draft_len(self) -> int:
        return lookahead_max_draft_len(self.window_size, self.ngram_size, self.verification_set_size)


class MTP(_SwitchesOff):
    """Multi-token prediction layers of the target itself (DeepSeek-style; TRT-LLM PyTorch flow)."""

    method: Literal["mtp"]
    runtimes: ClassVar[tuple[str, ...]] = ("trtllm-pytorch",)
    int8_draft: ClassVar[bool] = False
    compiles_draft: ClassVar[bool] = False
    proposer: ClassVar[str | None] = None
    max_draft_len: int = Field(1, ge=1, le=8)  # = num_nextn_predict_layers
    use_relaxed_acceptance_for_thinking: bool = False


Speculation = Annotated[
    Union[NoSpeculation, DraftTarget, Eagle, Eagle3, NGram, Medusa, Lookahead, MTP],
    Field(discriminator="method"),
]

# speculation.method → its class: the one registry of methods
SPEC_METHODS: dict[str, type[Strict]] = {
    cls.model_fields["method"].annotation.__args__[0]: cls
    for cls in (NoSpeculation, DraftTarget, Eagle, Eagle3, NGram, Medusa, Lookahead, MTP)
}
METHODS = tuple(SPEC_METHODS)
METHOD_RUNTIMES: dict[str, tuple[str, ...]] = {name: cls.runtimes for name, cls in SPEC_METHODS.items()}
TORCH_METHODS = tuple(name for name, cls in SPEC_METHODS.items() if "torch" in cls.runtimes)
WEIGHT_ONLY_METHODS = tuple(name for name, cls in SPEC_METHODS.items() if cls.int8_draft)
COMPILE_METHODS = tuple(name for name, cls in SPEC_METHODS.items() if cls.compiles_draft)


def draft_option_problem(method: str, backend: str, draft_weight_only: str,
                         compile_draft: bool) -> tuple[str, Any, str] | None:
    """(field, value, why) when a draft-only runtime option does not apply to this method and
    runtime; None when it does. The recipe, RuntimeSpec and the CLI all ask this one function."""
    cls = SPEC_METHODS[method]
    if draft_weight_only != "none" and (not cls.int8_draft or backend != "torch"):
        return ("runtime.draft_weight_only", draft_weight_only,
                f"applies to a draft model or an EAGLE-3 head in the torch runtime (speculation.method "
                f"{' or '.join(WEIGHT_ONLY_METHODS)}, runtime.backend torch), not to method '{method}' on '{backend}'")
    if compile_draft and (not cls.compiles_draft or backend != "torch"):
        return ("runtime.compile_draft", True,
                f"compiles a draft model's decode step in the torch runtime (speculation.method "
                f"{' or '.join(COMPILE_METHODS)}, runtime.backend torch), not method '{method}' on '{backend}'")
    return None


# --------------------------------------------------------------------------------------------
# runtime, limits, serving, validation


class Adaptive(Strict):
    """Run-time draft length: shrink or stop drafting where speculation does not pay."""

    enabled: bool = True
    policy: Literal["goodput", "acceptance", "off"] = Field(
        "goodput",
        description="torch runtime, with enabled: how each step's draft length is chosen. goodput: one k "
        "(0..max_draft_len) for the whole batch, the one with the most expected accepted tokens per second "
        "from the measured per-position acceptance and the draft and verify costs measured at the live batch "
        "size (SmartSpec; k 0 is ordinary decoding, no draft work). acceptance: each request's own k from its "
        "rolling acceptance and batch-1 cost ratios (the controller before goodput). off: always "
        "max_draft_len (as enabled: false). speculation.max_concurrency caps all three",
    )
    window: int = Field(64, ge=4, le=100_000, description="draft tokens in the rolling window (policy acceptance)")
    # None: derive break-even from the measured cost ratio (see trtspec.speculative.tune)
    min_acceptance_rate: float | None = Field(
        None, ge=0, le=1,
        description="acceptance below which drafting stops: per request under policy acceptance, and the router's "
        "fallback threshold. None: from the measured costs. Policy goodput does not read it: it weighs acceptance "
        "against the measured costs itself, and a fixed floor would lock a batch out of drafting (k 0 measures "
        "no acceptance)",
    )


class TrtllmOptions(Strict):
    """TensorRT-LLM specifics (ignored by the torch runtime)."""

    version: str = Field("1.2.1", description="TRT-LLM release the plan is generated for")
    checkpoint_dtype: Literal["float16", "bfloat16", "float32", "auto"] = "float16"
    gemm_plugin: Literal["auto", "float16", "bfloat16", "fp8", "disable"] = "auto"
    kv_cache_free_gpu_mem_fraction: float = Field(0.85, gt=0, le=1)
    draft_kv_cache_free_gpu_mem_fraction: float = Field(0.1, gt=0, le=1)
    enable_kv_cache_reuse: bool = True
    max_num_tokens: int | None = Field(None, ge=1)
    gpu_device_ids: list[int] | None = None
    draft_gpu_device_ids: list[int] | None = None
    container_image: str = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    examples_dir: str = Field(
        "/workspace/TensorRT-LLM/examples",
        description="TRT-LLM examples/ folder of the release in `version` (convert_checkpoint.py, quantize.py)",
    )
    model_family: Literal["auto", "llama", "mistral", "mixtral", "qwen"] = Field(
        "auto",
        description="engine flow: which convert_checkpoint.py to use; auto = config.json model_type of the target",
    )
    launch_mode: Literal["auto", "leader", "orchestrator", "orchestrator_prespawn"] = Field(
        "auto",
        description="engine flow: how tritonserver runs the engines (trtspec.triton.launch.mpi). leader: one engine over "
        "tp x pp MPI ranks; orchestrator: several engines, TRT-LLM spawns their ranks; orchestrator_prespawn: "
        "mpirun starts 1 + every engine's ranks (participant_ids; needed for draft logits). auto: leader for one "
        "engine, orchestrator for several, orchestrator_prespawn for draft_target with use_draft_logits",
    )
    # passthroughs (trtspec.passthrough): checked where the names are known, else passed with a warning
    llm_api_options: dict[str, Any] = Field(
        default_factory=dict,
        description="PyTorch flow: merged into extra_llm_api_options.yaml (and the baseline's), e.g. "
        "cuda_graph_config, enable_attention_dp, kv_cache_config.dtype; keys trtspec sets are refused",
    )
    build_args: list[str] = Field(
        default_factory=list,
        description="engine flow: extra trtllm-build flags for every engine, e.g. [--multiple_profiles, enable]",
    )

    @field_validator("llm_api_options")
    @classmethod
    def _llm_api_options(cls, v: dict[str, Any]) -> dict[str, Any]:

        check_llm_api_options(v)
        return v

    @field_validator("build_args")
    @classmethod
    def _build_args(cls, v: list[str]) -> list[str]:

        check_build_args(v)
        return v

    @model_validator(mode="after")
    def _mem(self) -> "TrtllmOptions":
        total = self.kv_cache_free_gpu_mem_fraction + self.draft_kv_cache_free_gpu_mem_fraction
        if total > 1.0:
            raise ValueError(
                f"kv_cache_free_gpu_mem_fraction + draft_kv_cache_free_gpu_mem_fraction = {total:.2f} > 1; "
                "draft and target share the GPU: lower one of them"
            )
        return self


class RuntimeConfig(Strict):
    backend: Runtime = "torch"
    dtype: Dtype = "float32"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    gpu_arch: GpuArch = Field("any", description="deployment GPU family; gates nvfp4 (Blackwell only)")
    torch_threads: int | None = Field(None, ge=1, le=1024)
    draft_weight_only: Literal["none", "int8"] = Field(
        "none",
        description="torch runtime, draft_target or eagle3: run the draft model's (or the EAGLE-3 head's, with "
        "an INT8 copy of the LM head it drafts with) linear layers with INT8 weights (W8A16, per-channel scales "
        "as ModelOpt int8_wo): about a quarter of the weight bytes per draft token; the unquantized target "
        "still verifies every token, so outputs do not change",
    )
    compile_draft: bool = Field(
        False,
        description="torch runtime, draft_target: compile the draft model's one-token step with torch.compile "
        "(inductor, needs a C++ compiler on CPU): a small draft's many small ops per token fuse into a few "
        "kernels; compiled when the engine is built (seconds for a 1-layer draft, minutes for a 24-layer one; "
        "cached on disk); outputs do not change",
    )
    quantized_kernels: Literal["native", "emulated"] = Field(
        "native",
        description="torch runtime: how a ModelOpt-quantized target or draft runs. native: on low-bit weight "
        "kernels where torch has them for the format and device (see quantized_kernels_for; `trtspec check` "
        "prints it), with the checkpoint's own INT8 values and scales; ModelOpt's fake-quant elsewhere. "
        "emulated: always ModelOpt's fake-quant (its reference numerics; slower than the unquantized model). "
        "Ordinary decoding beside speculation runs on the same kernels, so equivalence compares like with like",
    )
    batch_invariant: bool = Field(
        False,
        description="torch runtime: decode and verify passes compute attention one query at a time over exactly "
        "its keys, in fp32, as a one-token step does, so a token's logits do not depend on how many others share "
        "its pass (a verify pass, a batch of requests at different lengths). With row-invariant linears (the "
        "INT8/INT4 weight kernels, the LM head included: quantization.lm_head int8_wo) speculative output is then "
        "bit-identical to plain decoding of the same deployed target in bf16 (docs/quantization.md)",
    )
    adaptive: Adaptive = Adaptive()
    trtllm: TrtllmOptions = TrtllmOptions()


# what a quantized weight format runs on in the torch runtime, per device, when
# runtime.quantized_kernels is native (anything else: ModelOpt's fake-quant, "emulated")
NATIVE_KERNELS: dict[tuple[str, str], str] = {
    ("int8_wo", "cpu"): "INT8 weights, trtspec's wo_cpu kernel on an AVX512 CPU (bf16 dot products with "
                        "AVX512-BF16, else fp32 FMAs; in bf16, each decoder layer of a decode/verify pass one call: "
                        "wo_cpu.layer_step), else aten._weight_int8pack_mm (bf16 activations)",
    ("int8_wo", "cuda"): "INT8 weights, dequantized to bf16 per matmul",
    ("int4_wo", "cpu"): "INT4 weights (blocks of 128), trtspec's wo_cpu kernel on an AVX512 CPU (bf16 dot products "
                        "with AVX512-BF16, else fp32 FMAs; in bf16, each decoder layer of a decode/verify pass one "
                        "call: wo_cpu.layer_step), else aten._weight_int4pack_mm_for_cpu (bf16 activations)",
    ("int4_wo", "cuda"): "INT4 weights (blocks of 128), dequantized to bf16 per matmul",
    ("int4_awq", "cpu"): "INT4 weights (blocks of 128) with AWQ activation scales, trtspec's wo_cpu kernel on an "
                         "AVX512 CPU (layer by layer in torch ops: the AWQ scales), else "
                         "aten._weight_int4pack_mm_for_cpu (bf16 activations)",
    ("int4_awq", "cuda"): "INT4 weights (blocks of 128) with AWQ activation scales, dequantized to bf16 per matmul",
}


def quantized_kernels_for(fmt: str, device: str, choice: str = "native") -> str:
    """What a model quantized to ``fmt`` runs on in the torch runtime on ``device`` (cpu, cuda; auto
    reads as both): the native kernel where :data:`NATIVE_KERNELS` has one, else ModelOpt's fake-quant."""
    if fmt == "none":
        return "unquantized"
    emulated = "ModelOpt fake-quant (emulated: quantized values, fp matmuls)"
    if choice == "emulated":
        return emulated
    if device != "auto":
        return NATIVE_KERNELS.get((fmt, device), emulated)
    return "; ".join(f"{d}: {NATIVE_KERNELS.get((fmt, d), emulated)}" for d in ("cpu", "cuda"))


class Limits(Strict):
    max_batch_size: int = Field(8, ge=1, le=4096)
    max_input_len: int = Field(512, ge=1, le=1_048_576)
    max_seq_len: int = Field(1024, ge=2, le=1_048_576)
    max_prompt_bytes: int = Field(
        1_048_576, ge=1, le=2**31 - 1,
        description="text_input longer than this many bytes is refused before it is tokenized",
    )
    # Per-request bounds, checked by every entry point before it allocates anything (docs/limits.md).
    max_return_sequences: int = Field(
        4, ge=1, le=256, description="num_return_sequences (OpenAI: n) per request; each is one engine sequence")
    max_words: int = Field(32, ge=0, le=4096, description="stop words and bad words per request, each list")
    max_word_tokens: int = Field(32, ge=1, le=4096, description="token ids in one stop or bad word")
    max_word_bytes: int = Field(256, ge=1, le=65_536, description="bytes in one stop or bad word string")
    max_logprobs: int = Field(5, ge=0, le=1024, description="OpenAI logprobs / top_logprobs per token")
    max_request_key_bytes: int = Field(256, ge=1, le=65_536,
                                       description="the detokenizer's REQUEST_KEY (a streaming request's id)")
    max_prompts: int = Field(8, ge=1, le=4096, description="prompts in one OpenAI /v1/completions request")
    max_body_bytes: int = Field(4 * 1_048_576, ge=1024, le=2**31 - 1,
                                description="an OpenAI request body; larger bodies are refused unread (HTTP 413)")
    max_concurrent_requests: int = Field(
        64, ge=1, le=1_000_000, description="OpenAI requests in flight per trtspec serve process; beyond: HTTP 429")
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    pipeline_parallel_size: int = Field(1, ge=1, le=64)
    draft_tensor_parallel_size: int | None = Field(None, ge=1, le=64)

    @model_validator(mode="after")
    def _lens(self) -> "Limits":
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(
                f"max_input_len={self.max_input_len} must be smaller than max_seq_len={self.max_seq_len} "
                "(max_seq_len counts prompt + generated tokens)"
            )
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            v = getattr(self, name)
            if v & (v - 1):
                raise ValueError(f"{name}={v} must be a power of two (1, 2, 4, 8, ...)")
        return self

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


class ServingTls(Strict):
    """gRPC over TLS (Triton's ``--grpc-use-ssl[-mutual]``); paths are relative to the recipe.
    HTTP has no TLS in Triton 2.51: under TLS trtspec binds it to 127.0.0.1 (docs/security.md)."""

    cert: str = Field(description="the server's certificate (chain), PEM")
    key: str = Field(description="the server's private key, PEM")
    ca: str | None = Field(None, description="mutual TLS: clients must present a certificate this CA signed")
    server_ca: str | None = Field(
        None, description="what trtspec's own clients of the server (router relay, watchdog, OpenAI relay) verify "
        "its certificate with; default ca, else cert (self-signed)")
    server_name: str | None = Field(
        None, description="the name those clients check in the certificate; default its first DNS name")


class Serving(Strict):
    host: str = "127.0.0.1"
    grpc_port: int = Field(0, ge=0, le=65535, description="0 = pick a free port")
    http_port: int = Field(0, ge=0, le=65535)
    metrics_port: int = Field(0, ge=0, le=65535)
    instances: int = Field(1, ge=1, le=64)
    streaming: bool = True
    speculative_fraction: float = Field(
        1.0, ge=0, le=1, description="share of traffic the router sends to the speculative path"
    )
    max_queue_size: int = Field(64, ge=0, le=1_000_000)
    ready_timeout_s: float = Field(180, gt=0)
    tritonserver_args: list[str] = Field(
        default_factory=list,
        description="extra tritonserver arguments, e.g. [--log-info=false]; ones trtspec sets are refused",
    )
    unsafe_passthrough: bool = Field(
        False, description="allow tritonserver_args that widen exposure (--*-address, --allow-*, "
        "--model-control-mode, ...); off: such flags are refused (docs/security.md)")

    @field_validator("tritonserver_args")
    @classmethod
    def _tritonserver_args(cls, v: list[str]) -> list[str]:
        check_tritonserver_args(v, unsafe=True)  # form and trtspec's own flags; exposure: below
        return v

    @model_validator(mode="after")
    def _tritonserver_args_exposure(self) -> "Serving":
        try:  # flags that widen exposure need serving.unsafe_passthrough: true (docs/security.md)
            check_tritonserver_args(self.tritonserver_args, unsafe=self.unsafe_passthrough)
        except ValueError as e:
            raise ValueError(f"tritonserver_args: {e}") from None
        return self
    decoupled: bool = Field(
        True, description="NVIDIA's decoupled_mode: true streams (one response per step, gRPC stream API only); "
        "false renders models that answer one response per request, unary ModelInfer included")
    engine_process: Literal["worker", "thread"] = Field(
        "worker", description="torch runtime: where a served engine runs. worker: its own process, loop on its "
        "main thread (torch's CPU kernels run as in-process; the python stub relays; docs/serving.md); "
        "thread: a thread of the python stub (the weights in the stub; ~0.2 ms more per parallel region)")
    stream_interval: int = Field(
        1, ge=1, le=1024, description="torch runtime: a streaming response every N engine steps, carrying their "
        "tokens together (TensorRT-LLM's stream_interval): fewer hops per token through the stub, router and "
        "postprocessing; the first token and the last are never held (docs/serving.md)")
    tls: ServingTls | None = Field(None, description="gRPC over TLS, end to end (serve --tls-* override it)")
    require_header: str | None = Field(
        None, description="a header every inference/metadata call must carry (a gateway adds it); its value comes "
        "from $TRTSPEC_REQUIRED_HEADER_VALUE at serve time, never from the recipe (serve --require-header)")

    @field_validator("require_header")
    @classmethod
    def _require_header(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,63}", v):
            raise ValueError(f"{v!r} is not a usable header name: lower-case letters, digits and '-' "
                             "(e.g. x-gateway-key)")
        return v


class Sampling(Strict):
    temperature: float = Field(0.0, ge=0, le=100)
    top_k: int = Field(0, ge=0, le=1_000_000)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int = Field(0, ge=0)
    beam_width: int = Field(1, ge=1, le=64)


class Gates(Strict):
    """Rollout gates: all must pass to deploy speculative; else keep the baseline (docs/validation.md).

    Speed and latency gates judge the 95 % interval over the interleaved blocks, on its
    conservative side: the speedup's lower bound, the latency ratios' upper bounds."""

    min_speedup: float = Field(1.1, gt=0, description="speculative / baseline output tokens/s at at_concurrency: "
                               "the 95 % interval's lower bound must reach it")
    at_concurrency: int = Field(1, ge=1)
    max_mismatch_rate: float = Field(0.0, ge=0, le=1, description="greedy prompts allowed to differ")
    min_acceptance_rate: float = Field(0.3, ge=0, le=1)
    latency_tolerance: float | None = Field(
        0.10, ge=0, le=10, description="tail gates at every validated concurrency: speculative P95 and P99 request "
        "latency, TTFT p95 and ITL p95 <= baseline x (1 + latency_tolerance), on the ratio's 95 % upper bound; "
        "null turns the tail gates off (the per-level table still shows every ratio, marked 'not gated')")


class Validation(Strict):
    prompts: str = Field("builtin:code", description="builtin:code | builtin:chat | builtin:mixed | path.jsonl")
    num_prompts: int = Field(16, ge=1, le=100_000)
    max_tokens: int = Field(64, ge=1, le=1_048_576)
    concurrency: list[int] = Field(default_factory=lambda: [1, 2, 4])
    requests_per_level: int = Field(16, ge=1, description="requests per model and level measured at least")
    max_requests_per_level: int | None = Field(
        None, ge=1, description="request budget per model and level: more interleaved blocks run until the "
        "speedup's 95 % interval is within interval_width, or this many requests ran (default 4 x requests_per_level)")
    interval_width: float = Field(
        0.10, gt=0, le=10, description="stop a level once the speedup's 95 % interval spans at most this fraction "
        "of the speedup (0.10: about +-5 %)")
    block_requests: int | None = Field(
        None, ge=1, description="measured requests per model in one interleaved block (default max(8, 4 x concurrency))")
    warmup_requests: int = Field(2, ge=0)
    equivalence_tolerance: int = Field(
        0, ge=0, description="greedy prompts may differ from the baseline only after this many tokens (0 = exact)"
    )
    sampled_check_samples: int = Field(0, ge=0, description="samples per prompt for the sampled check")
    sampling: Sampling = Sampling()
    gates: Gates = Gates()

    @field_validator("concurrency")
    @classmethod
    def _conc(cls, v: list[int]) -> list[int]:
        if not v or any(c < 1 for c in v):
            raise ValueError("concurrency must be a non-empty list of integers >= 1, e.g. [1, 2, 4]")
        return v

    @model_validator(mode="after")
    def _budget(self) -> "Validation":
        if self.max_requests_per_level is not None and self.max_requests_per_level < self.requests_per_level:
            raise _FieldProblem(
                "validation.max_requests_per_level", self.max_requests_per_level,
                f"the request budget is below requests_per_level ({self.requests_per_level}); raise it to at "
                f"least {self.requests_per_level} or lower requests_per_level")
        return self

    @property
    def request_budget(self) -> int:
        """Requests per model and level at most (``max_requests_per_level``, default 4 × the minimum)."""
        return self.max_requests_per_level or 4 * self.requests_per_level


# --------------------------------------------------------------------------------------------
# the recipe


class Recipe(Strict):
    """A deployment recipe (``build_configs/*.yaml``)."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=100)
    description: str = ""
    target: ModelSpec
    speculation: Speculation
    runtime: RuntimeConfig = RuntimeConfig()
    limits: Limits = Limits()
    serving: Serving = Serving()
    validation: Validation = Validation()

    @model_validator(mode="after")
    def _cross(self) -> "Recipe":
        method, backend = self.speculation.method, self.runtime.backend
        allowed = SPEC_METHODS[method].runtimes
        if backend not in allowed:
            raise _FieldProblem(
                "runtime.backend",
                backend,
                f"speculation method '{method}' does not run on runtime '{backend}'; "
                f"it runs on: {', '.join(allowed)}",
            )
        if method != "none" and self.validation.sampling.beam_width > 1:
            raise _FieldProblem(
                "validation.sampling.beam_width",
                self.validation.sampling.beam_width,
                "beam search cannot be combined with speculative decoding (no runtime supports it); "
                "use beam_width: 1 or speculation.method: none",
            )
        if method == "medusa" and self.validation.sampling.temperature > 0:
            raise _FieldProblem(
                "validation.sampling.temperature",
                self.validation.sampling.temperature,
                "Medusa decodes greedily only; set temperature: 0",
            )
        if method == "eagle" and self.limits.pipeline_parallel_size > 1:
            raise _FieldProblem(
                "limits.pipeline_parallel_size",
                self.limits.pipeline_parallel_size,
                "EAGLE does not support pipeline parallelism; use tensor parallelism instead",
            )
        if getattr(self.speculation, "max_concurrency", None) is not None and backend == "trtllm-engine":
            raise _FieldProblem(
                "speculation.max_concurrency",
                self.speculation.max_concurrency,
                "the TensorRT-LLM engine flow has no run-time switch to stop speculating (TRT-LLM's "
                "max_concurrency is PyTorch flow only); drop it, or use runtime.backend trtllm-pytorch or torch",
            )
        if getattr(self.speculation, "draft_vocab_size", None) is not None and backend != "torch":
            raise _FieldProblem(
                "speculation.draft_vocab_size", self.speculation.draft_vocab_size,
                f"a draft vocabulary cut runs in trtspec's torch runtime, not on '{backend}' (TRT-LLM's draft-target "
                "flow drafts over the whole vocabulary); drop it, or use runtime.backend torch",
            )
        problem = draft_option_problem(method, backend, self.runtime.draft_weight_only, self.runtime.compile_draft)
        if problem is not None:
            field, value, why = problem
            fix = ("set it to none, or quantize the draft with speculation.draft.quantization for TRT-LLM"
                   if field == "runtime.draft_weight_only" else "set it to false")
            raise _FieldProblem(field, value, f"{why}; {fix}")
        if backend == "torch" and self.limits.world_size > 1:
            raise _FieldProblem(
                "limits.tensor_parallel_size",
                self.limits.tensor_parallel_size,
                "the torch runtime runs on one device; use a trtllm runtime for TP/PP > 1",
            )
        if self.validation.max_tokens + 1 > self.limits.max_seq_len:
            raise _FieldProblem(
                "validation.max_tokens",
                self.validation.max_tokens,
                f"does not fit in limits.max_seq_len={self.limits.max_seq_len}",
            )
        return self

    # ---- conveniences
    @property
    def draft_spec(self) -> ModelSpec | None:
        return getattr(self.speculation, "draft", None) or getattr(self.speculation, "head", None)

    @property
    def max_draft_len(self) -> int:
        s = self.speculation
        if isinstance(s, Lookahead):
            return s.effective_max_draft_len
        return getattr(s, "max_draft_len", 0)


class _FieldProblem(ValueError):
    """Raised inside cross-field validators so the error points at the right field."""

    def __init__(self, field: str, value: Any, problem: str):
        self.field, self.value, self.problem = field, value, problem
        super().__init__(problem)


# --------------------------------------------------------------------------------------------
# loading


_FIXES = {
    "extra_forbidden": "remove the key, or check its spelling against the schema (trtspec check --schema)",
    "missing": "add the key",
    "literal_error": "use one of the allowed values",
    "union_tag_invalid": "use one of the allowed methods: " + ", ".join(METHODS),
    "union_tag_not_found": "add speculation.method (one of: " + ", ".join(METHODS) + ")",
}


def _loc(loc: tuple) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p in METHODS or (isinstance(p, str) and p.startswith("function-")):
            continue  # discriminated-union branch name, not a user key
        else:
            parts.append(("." if parts else "") + str(p))
    return "".join(parts) or "<root>"


def _from_validation_error(exc: ValidationError) -> list[ConfigError]:
    out: list[ConfigError] = []
    for err in exc.errors(include_url=False):
        ctx_err = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_err, _FieldProblem):
            out.append(ConfigError(ctx_err.field, ctx_err.value, ctx_err.problem))
            continue
        field = _loc(tuple(err["loc"]))
        msg = err["msg"]
        value = err.get("input")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        # model-level validators report at the node; point at the key they name ("key: ..." or
        # "key=value ...") and show that key's value rather than the whole node
        key = None
        head = msg.split(" ")[0]
        if err["type"] == "value_error" and head.endswith(":") and head[:-1].isidentifier():
            key, msg = head[:-1], msg.split(":", 1)[1].strip()
        elif err["type"] == "value_error" and "=" in head and head.split("=")[0].isidentifier():
            key = head.split("=")[0]
        if key is not None:
            field = f"{field}.{key}" if field != "<root>" else key
            if isinstance(value, dict) and key in value:
                value = value[key]
        out.append(ConfigError(field, value, msg, fix=_FIXES.get(err["type"])))
    return out


def section_subset(name: str, section: type[Strict], fields: tuple[str, ...], **defaults: Any) -> type[Strict]:
    """A Strict model of ``fields`` of the recipe's ``section``: the same types, bounds and
    descriptions, declared once in the section (``defaults`` replaces a field's default). For what
    a later stage carries of a recipe, e.g. the torch runtime's RuntimeSpec."""
    def field_of(f: str):
        info = section.model_fields[f]
        if f in defaults:
            info = info.merge_field_infos(info, default=defaults[f])
        return (info.annotation, info)

    return create_model(name, __base__=Strict, **{f: field_of(f) for f in fields})


def section_errors(exc: ValidationError) -> list[ConfigError]:
    """A section model's validation error as ConfigErrors naming each field (as a recipe's do)."""
    return _from_validation_error(exc)


def parse_recipe(data: Any, *, source: str | None = None, base_dir: pathlib.Path | None = None) -> Recipe:
    """Validate a recipe mapping. Raises ``ConfigErrors`` listing every problem."""
    if not isinstance(data, dict):
        raise ConfigErrors(
            [ConfigError("<root>", type(data).__name__, "a recipe must be a YAML mapping of keys to values")],
            source,
        )
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise ConfigErrors(_from_validation_error(exc), source) from None
    if base_dir is not None:
        recipe = _resolve_paths(recipe, base_dir)
    return recipe


def load_recipe(path: str | pathlib.Path) -> Recipe:
    """Read and validate ``path``. Relative model paths resolve against the file's folder."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise ConfigErrors(
            [ConfigError("CONFIG", str(p), "recipe file not found", fix="pass a path such as build_configs/tiny-cpu-draft-target.yaml")]
        )
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        raise ConfigErrors(
            [ConfigError("<yaml>", where, f"not valid YAML: {getattr(exc, 'problem', exc)}")], str(p)
        ) from None
    return parse_recipe(data, source=str(p), base_dir=p.resolve().parent)


def _resolve(base: pathlib.Path, value: str | None) -> str | None:
    if value is None:
        return None
    if value.startswith("builtin"):
        return value
    path = pathlib.Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def _resolve_dataset(base: pathlib.Path, value: str) -> str:
    """A calibration dataset that names a path resolves like any path; builtin, a named dataset
    and a Hugging Face id (org/name, hf://...) stay as they are unless such a path exists here."""
    if value in NAMED or value.startswith("hf://"):
        return value
    if is_dataset_id(value) and not (base / value).exists():
        return value
    return _resolve(base, value)


def _resolve_model(base: pathlib.Path, value: str | None) -> str | None:
    """A model path resolves like any path; a hub id (hf://org/name, or org/name that is no
    folder here) stays for trtspec.hub to resolve through the cache."""
    if value is None or value.startswith(PREFIX) or (is_hub_id(value) and not (base / value).exists()):
        return value
    return _resolve(base, value)


def _resolve_spec(spec: ModelSpec, base: pathlib.Path) -> ModelSpec:
    cal = spec.quantization.calibration
    quant = spec.quantization.model_copy(
        update={"calibration": cal.model_copy(update={"dataset": _resolve_dataset(base, cal.dataset)})}
    )
    return spec.model_copy(
        update={"model": _resolve_model(base, spec.model), "tokenizer": _resolve_model(base, spec.tokenizer),
                "quantization": quant}
    )


def _resolve_paths(recipe: Recipe, base: pathlib.Path) -> Recipe:
    update: dict[str, Any] = {"target": _resolve_spec(recipe.target, base)}
    spec = recipe.speculation
    for key in ("draft", "head"):
        if hasattr(spec, key):
            update["speculation"] = spec.model_copy(update={key: _resolve_spec(getattr(spec, key), base)})
    tls = recipe.serving.tls
    if tls is not None:
        files = {k: _resolve(base, getattr(tls, k)) for k in ("cert", "key", "ca", "server_ca")}
        update["serving"] = recipe.serving.model_copy(update={"tls": tls.model_copy(update=files)})
    val = recipe.validation
    if not val.prompts.startswith("builtin:"):
        update["validation"] = val.model_copy(update={"prompts": _resolve(base, val.prompts)})
    return recipe.model_copy(update=update)


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    return recipe.model_dump(mode="json")


def json_schema() -> dict[str, Any]:
    return Recipe.model_json_schema()
