"""Passthroughs: the knobs a recipe hands to TRT-LLM and Triton beyond trtspec's own fields.

* ``runtime.trtllm.llm_api_options``: merged into the generated ``extra_llm_api_options.yaml``
  (and the baseline's) of the PyTorch flow, e.g. ``cuda_graph_config``, ``enable_attention_dp``,
  ``kv_cache_config.dtype``;
* ``runtime.trtllm.build_args``: extra ``trtllm-build`` flags for every engine of the engine
  flow, e.g. ``["--multiple_profiles", "enable"]``;
* ``serving.tritonserver_args``: extra ``tritonserver`` arguments, e.g. ``["--log-info=false"]``;
  an argument that widens exposure (:data:`EXPOSURE`: addresses, ports, ``--allow-*`` turned on,
  model control, restricted-API rules, header forwarding, gRPC TLS, code or model folders) is
  refused unless the recipe says ``serving.unsafe_passthrough: true`` (docs/security.md); getopt's
  abbreviations (``--grpc-addr``) count as the option they abbreviate.

Each is checked where the names are known: a key or flag trtspec sets itself is refused, naming
the recipe field that sets it (two sources for one value would let the manifest, the plan and
the server disagree); a known flag with a value outside its choices is refused; a name this
module does not know is passed through with a warning (it may be newer than our lists).
Torch-free and import-light: :mod:`trtspec.config` validates with it.
"""

from __future__ import annotations

from typing import Any, Mapping

from trtspec.trtllm import accepted_names as A

LLM_API_FIELD = "runtime.trtllm.llm_api_options"
BUILD_FIELD = "runtime.trtllm.build_args"
TRITON_FIELD = "serving.tritonserver_args"

# LLM() keys trtspec writes itself → the recipe field that sets them
OWNED_LLM_API: dict[str, str] = {
    "model": "target.model",
    "tokenizer": "target.tokenizer",
    "backend": "runtime.backend",
    "tensor_parallel_size": "limits.tensor_parallel_size",
    "pipeline_parallel_size": "limits.pipeline_parallel_size",
    "max_batch_size": "limits.max_batch_size",
    "max_input_len": "limits.max_input_len",
    "max_seq_len": "limits.max_seq_len",
    "max_num_tokens": "runtime.trtllm.max_num_tokens",
    "speculative_config": "speculation (method, max_draft_len, the draft or head)",
    "disable_overlap_scheduler": "speculation.method (trtspec turns the overlap scheduler off for two-model drafting)",
    "kv_cache_config.free_gpu_memory_fraction": "runtime.trtllm.kv_cache_free_gpu_mem_fraction",
    "kv_cache_config.enable_block_reuse": "runtime.trtllm.enable_kv_cache_reuse",
}

# trtllm-build flags trtspec writes itself (trtspec.trtllm.commands.build_argv)
OWNED_BUILD: dict[str, str] = {
    "--checkpoint_dir": "the plan (each engine's checkpoint stage)",
    "--output_dir": "the plan (build -o OUT)",
    "--gemm_plugin": "runtime.trtllm.gemm_plugin",
    "--kv_cache_type": "trtspec (paged: KV-cache reuse needs it)",
    "--use_paged_context_fmha": "trtspec (enabled: KV-cache reuse and draft-target need it)",
    "--max_batch_size": "limits.max_batch_size",
    "--max_input_len": "limits.max_input_len",
    "--max_seq_len": "limits.max_seq_len",
    "--max_num_tokens": "runtime.trtllm.max_num_tokens",
    "--speculative_decoding_mode": "speculation.method",
    "--max_draft_len": "speculation.max_draft_len",
    "--gather_generation_logits": "speculation.use_draft_logits",
    "--workers": "limits.tensor_parallel_size x limits.pipeline_parallel_size",
}

# tritonserver arguments trtspec's launcher writes itself (trtspec.triton.launch.server / mpi)
OWNED_TRITON: dict[str, str] = {
    "--model-repository": "trtspec serve REPO",
    "--http-address": "serving.host", "--grpc-address": "serving.host", "--metrics-address": "serving.host",
    "--http-port": "serving.http_port", "--grpc-port": "serving.grpc_port", "--metrics-port": "serving.metrics_port",
    "--backend-config": "trtspec (the python backend's shared-memory prefix per server)",
    "--backend-directory": "trtspec (the bundled CPU tritonserver's backends)",
    "--cache-directory": "trtspec (the bundled CPU tritonserver's caches)",
    "--disable-auto-complete-config": "trtspec (configs are rendered complete)",
    "--model-control-mode": "trtspec (explicit with the watchdog and MPI ranks)",
    "--load-model": "trtspec (the watchdog and MPI ranks load every model)",
    "--exit-timeout-secs": "trtspec (the launcher's shutdown)",
    "--log-verbose": "trtspec serve (the launcher's log level)",
    "--allow-http": "trtspec (MPI ranks > 0 serve no endpoints)",
    "--allow-grpc": "trtspec (MPI ranks > 0 serve no endpoints)",
    "--allow-metrics": "trtspec (MPI ranks > 0 serve no endpoints)",
}


def _owned(name: str, by: str, field: str) -> ValueError:
    return ValueError(f"{name} is set by trtspec from {by}; set that instead, or drop {name} from {field}")


def check_llm_api_options(options: Mapping[str, Any]) -> list[str]:
    """Refuses (``ValueError`` naming the key and its owner) what trtspec writes itself; returns
    warnings for keys not in TRT-LLM 1.2's ``TorchLlmArgs`` as trtspec knows it."""
    warnings: list[str] = []
    for key, value in options.items():
        if key in OWNED_LLM_API:
            raise _owned(key, OWNED_LLM_API[key], LLM_API_FIELD)
        if key == "kv_cache_config":
            if not isinstance(value, Mapping):
                raise ValueError(f"kv_cache_config must be a mapping of KvCacheConfig keys, "
                                 f"not {type(value).__name__}")
            for sub in value:
                dotted = f"kv_cache_config.{sub}"
                if dotted in OWNED_LLM_API:
                    raise _owned(dotted, OWNED_LLM_API[dotted], LLM_API_FIELD)
                if sub not in A.KV_CACHE_CONFIG_KEYS:
                    warnings.append(f"{LLM_API_FIELD}: kv_cache_config.{sub} is not a KvCacheConfig key trtspec "
                                    f"knows (TRT-LLM {A.TRTLLM_RELEASE}); passed through as it is")
        elif key not in A.LLM_ARGS_KEYS | A.LLM_API_PASSTHROUGH_KEYS:
            warnings.append(f"{LLM_API_FIELD}: {key} is not an LLM-API key trtspec knows (TRT-LLM "
                            f"{A.TRTLLM_RELEASE}, {A.LLM_ARGS_SOURCE}); passed through as it is")
    return warnings


def merge_llm_api_options(options: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with ``extra`` merged in (``kv_cache_config`` key by key); a new dict."""
    out = dict(options)
    for key, value in extra.items():
        if key == "kv_cache_config" and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def _split(args: list[str] | tuple[str, ...], field: str) -> list[tuple[str, str | None, bool]]:
    """[(flag, value or None, value came attached with '=')] from an argument list."""
    out: list[tuple[str, str | None, bool]] = []
    i = 0
    while i < len(args):
        a = args[i]
        if not isinstance(a, str) or not a.startswith("-"):
            raise ValueError(f"{a!r} is not a flag; write flags as '--name' followed by their value")
        if "=" in a:
            flag, value = a.split("=", 1)
            out.append((flag, value, True))
            i += 1
        elif i + 1 < len(args) and not str(args[i + 1]).startswith("-"):
            out.append((a, args[i + 1], False))
            i += 2
        else:
            out.append((a, None, False))
            i += 1
    return out


def check_build_args(args: list[str] | tuple[str, ...]) -> list[str]:
    """Refuses flags trtspec sets and known flags with a wrong value; warns on unknown flags."""
    warnings: list[str] = []
    flags = A.TRTLLM_BUILD.flags
    for flag, value, _ in _split(args, BUILD_FIELD):
        if flag in OWNED_BUILD:
            raise _owned(flag, OWNED_BUILD[flag], BUILD_FIELD)
        if flag not in flags:
            warnings.append(f"{BUILD_FIELD}: {flag} is not a trtllm-build flag trtspec knows (TRT-LLM "
                            f"{A.TRTLLM_RELEASE}, {A.TRTLLM_BUILD.source}); passed through as it is")
            continue
        spec = flags[flag]
        if spec is None and value is not None:
            raise ValueError(f"{flag} is a switch and takes no value (got {value!r}); write it alone")
        if spec is not None and value is None:
            raise ValueError(f"{flag} needs a value"
                             + (f" (one of {', '.join(spec)})" if isinstance(spec, tuple) else ""))
        if isinstance(spec, tuple) and value not in spec:
            raise ValueError(f"{flag} {value!r} is not one of {', '.join(spec)} "
                             f"(TRT-LLM {A.TRTLLM_RELEASE})")
    return warnings


def build_argv_tail(args: list[str] | tuple[str, ...]) -> list[str]:
    """``build_args`` as separate argv items (``--flag=value`` becomes ``--flag value``)."""
    out: list[str] = []
    for flag, value, _ in _split(args, BUILD_FIELD):
        out.append(flag)
        if value is not None:
            out.append(value)
    return out


UNSAFE_FIELD = "serving.unsafe_passthrough"

# tritonserver options that widen who can reach the server or what they may do there; refused in
# serving.tritonserver_args unless the recipe says serving.unsafe_passthrough: true. Each entry:
# (pattern over the option's full name, why). tritonserver keeps the *last* of a repeated option,
# and serving.tritonserver_args come after trtspec's own: any of these would silently win.
EXPOSURE: tuple[tuple[str, str], ...] = (
    (r"--.+-address", "binds an endpoint to the address it names (trtspec binds --host only; HTTP stays on "
                      "127.0.0.1 under TLS)"),
    (r"--.+-port(-range)?", "opens or moves an endpoint (or shares its port with other processes)"),
    (r"--allow-.+", "turns an endpoint or a metrics family on"),
    (r"--model-control-mode", "changes who may load and unload models (the watchdog and the MPI ranks need "
                              "trtspec's own mode)"),
    (r"--.+-restricted-.+", "adds a restricted-API rule (Triton allows one per API: it would replace the "
                            "launch's admin secret or the required header)"),
    (r"--(http|grpc)-header-forward-pattern", "forwards request headers (the admin key, the required header) "
                                              "to the models"),
    (r"--grpc-(use-ssl|use-ssl-mutual|server-cert|server-key|root-cert)", "changes gRPC's TLS, which "
                                                                          "serving.tls sets"),
    (r"--(backend|repoagent)-directory", "loads native code from another folder"),
    (r"--model-repository|--model-store", "serves models from another folder"),
)
# --allow-* values that turn nothing on (narrowing is always fine)
_OFF = {"false", "0", "no", "off"}


def _resolve(flag: str) -> str:
    """The option tritonserver reads for ``flag``: getopt_long takes any unambiguous prefix of a
    long option (``--grpc-addr`` is ``--grpc-address``); an exact name wins."""
    if flag in A.TRITONSERVER_FLAGS:
        return flag
    hits = [f for f in A.TRITONSERVER_FLAGS if f.startswith(flag)] if flag.startswith("--") and len(flag) > 2 else []
    return hits[0] if len(hits) == 1 else flag


def exposure(flag: str, value: str | None) -> str | None:
    """Why ``flag`` (its full name) with ``value`` widens exposure, or None."""
    import re

    for pattern, why in EXPOSURE:
        if re.fullmatch(pattern, flag):
            if flag.startswith("--allow-") and value is not None and value.strip().lower() in _OFF:
                return None  # --allow-X=false turns something off
            return why
    return None


def check_tritonserver_args(args: list[str] | tuple[str, ...], *, unsafe: bool = False) -> list[str]:
    """Refuses arguments that widen exposure (unless ``unsafe``: ``serving.unsafe_passthrough``) and
    arguments trtspec's launcher sets; warns on names tritonserver 2.51 does not list and on every
    exposure-widening argument let through."""
    warnings: list[str] = []
    for given, value, _ in _split(args, TRITON_FIELD):
        flag = _resolve(given)
        named = given if flag == given else f"{given} (tritonserver reads it as {flag})"
        why = exposure(flag, value)
        if why is not None:
            if not unsafe:
                owner = f" (trtspec sets it: {OWNED_TRITON[flag]})" if flag in OWNED_TRITON else ""
                raise ValueError(
                    f"{named} widens the server's exposure: it {why}{owner}; trtspec refuses it in {TRITON_FIELD}. "
                    f"Drop it, or, if you mean it, set {UNSAFE_FIELD}: true (docs/security.md)")
            warnings.append(f"{TRITON_FIELD}: {named} widens the server's exposure ({why}); passed through "
                            f"because {UNSAFE_FIELD} is true")
            continue
        if flag in OWNED_TRITON:
            raise _owned(named, OWNED_TRITON[flag], TRITON_FIELD)
        if flag not in A.TRITONSERVER_FLAGS:
            warnings.append(f"{TRITON_FIELD}: {given} is not a tritonserver option trtspec knows "
                            f"({A.TRITONSERVER_SOURCE}); passed through as it is")
    return warnings


def recipe_warnings(llm_api_options: Mapping[str, Any], build_args: list[str], tritonserver_args: list[str],
                    *, backend: str) -> list[str]:
    """Every passthrough warning of a recipe, plus a passthrough its runtime does not use. For a
    validated recipe: an exposure-widening tritonserver argument got there only with
    ``serving.unsafe_passthrough`` (config.Serving refuses it otherwise), so it is a warning here."""
    out = check_llm_api_options(llm_api_options) + check_build_args(build_args) + \
        check_tritonserver_args(tritonserver_args, unsafe=True)
    if llm_api_options and backend != "trtllm-pytorch":
        out.append(f"{LLM_API_FIELD} is used by runtime.backend trtllm-pytorch only; runtime {backend} ignores it")
    if build_args and backend != "trtllm-engine":
        out.append(f"{BUILD_FIELD} is used by runtime.backend trtllm-engine only; runtime {backend} ignores it")
    return out
