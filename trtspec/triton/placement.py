"""Where each engine of a deployment runs: its MPI ranks and GPUs (pure, golden-tested).

The :class:`Layout` of a deployment is shared by the repository renderer (each engine's
``gpu_device_ids`` / ``participant_ids``, :func:`placement_parameters`) and the MPI launcher
(:mod:`trtspec.triton.launch.mpi`), so the command and the model configs cannot disagree.
The launch modes are described in :mod:`trtspec.triton.launch.mpi`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from trtspec.errors import ConfigError

MODES = ("single", "leader", "orchestrator", "orchestrator_prespawn")

# Engine roles of a build (TrtllmBuild.engines keys) → the Triton model that serves each one
# (trtspec.triton.render names them so), in MPI rank order: the draft's ranks come first in
# orchestrator_prespawn, as in NVIDIA's draft-target instructions.
ENGINE_MODELS: dict[str, str] = {
    "draft": "tensorrt_llm_draft",
    "target": "tensorrt_llm",
    "baseline": "tensorrt_llm_baseline",
}

_ORCHESTRATOR_ENV = {
    "orchestrator": (("TRTLLM_ORCHESTRATOR", "1"), ("TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES", "1")),
    "orchestrator_prespawn": (("TRTLLM_ORCHESTRATOR", "1"), ("TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES", "0")),
}


def _ids(ids: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in ids)


@dataclass(frozen=True)
class Placement:
    """Where one engine model runs: its GPUs, and in orchestrator_prespawn its MPI ranks."""

    model: str  # Triton model name
    role: str  # target | draft | baseline
    ranks: int  # tp x pp of the engine
    gpu_device_ids: tuple[int, ...]
    participant_ids: tuple[int, ...] | None = None  # orchestrator_prespawn only
    fast_logits: bool = False  # speculative_decoding_fast_logits (draft-target with draft logits, prespawn)

    def parameters(self) -> dict[str, str]:
        """The tensorrtllm backend ``config.pbtxt`` parameters this placement decides."""
        p = {"gpu_device_ids": _ids(self.gpu_device_ids)}
        if self.participant_ids is not None:
            p["participant_ids"] = _ids(self.participant_ids)
        if self.fast_logits:
            p["speculative_decoding_fast_logits"] = "1"
        return p


@dataclass(frozen=True)
class Layout:
    """What runs where: the launch mode, the MPI world and each engine's placement."""

    mode: str
    world_size: int  # tritonserver processes mpirun starts (1 in single and orchestrator)
    placements: tuple[Placement, ...] = ()
    gpus: tuple[int, ...] = ()  # every device id a process of this deployment uses

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        return _ORCHESTRATOR_ENV.get(self.mode, ())

    @property
    def engine_models(self) -> tuple[str, ...]:
        return tuple(p.model for p in self.placements)

    def placement(self, role: str) -> Placement:
        for p in self.placements:
            if p.role == role:
                return p
        raise KeyError(role)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "world_size": self.world_size,
            "gpus": list(self.gpus),
            "env": dict(self.env),
            "engines": [
                {"model": p.model, "role": p.role, "ranks": p.ranks, "gpu_device_ids": list(p.gpu_device_ids),
                 "participant_ids": None if p.participant_ids is None else list(p.participant_ids),
                 "fast_logits": p.fast_logits}
                for p in self.placements
            ],
        }


def engine_layout(build, launch_mode: str = "auto") -> Layout:
    """The layout of a TRT-LLM engine-flow build (a :class:`~trtspec.trtllm.handoff.TrtllmBuild`)."""
    roles = [r for r in ENGINE_MODELS if r in build.engines]
    if not roles:
        raise ConfigError("runtime.backend", build.runtime, "the build has no engines to serve",
                          fix="run `trtspec build` for a trtllm-engine recipe")
    ranks = {"target": build.world_size, "baseline": build.world_size, "draft": build.draft_tp_size or 1}
    devices = {"target": build.gpu_device_ids, "baseline": build.gpu_device_ids,
               "draft": build.draft_gpu_device_ids}
    for role in roles:
        ids = devices[role]
        field_name = "runtime.trtllm.draft_gpu_device_ids" if role == "draft" else "runtime.trtllm.gpu_device_ids"
        if ids is None or len(ids) != ranks[role]:
            raise ConfigError(field_name, ids,
                              f"the {role} engine runs {ranks[role]} rank(s) and needs one GPU id per rank",
                              fix=f"list {ranks[role]} device id(s) and rebuild the hand-off (trtspec build)")
    fast = "draft" in roles and build.use_draft_logits
    mode = launch_mode
    if mode == "auto":
        mode = "leader" if len(roles) == 1 else ("orchestrator_prespawn" if fast else "orchestrator")
    names = ", ".join(ENGINE_MODELS[r] for r in roles)
    if mode == "leader" and len(roles) > 1:
        raise ConfigError("runtime.trtllm.launch_mode", mode,
                          f"leader mode runs one engine across all MPI ranks; this deployment serves "
                          f"{len(roles)} engines ({names})",
                          fix="use launch_mode: orchestrator or orchestrator_prespawn (or auto)")
    if mode not in ("leader", "orchestrator", "orchestrator_prespawn"):
        raise ConfigError("runtime.trtllm.launch_mode", launch_mode,
                          "engines are served in leader, orchestrator or orchestrator_prespawn mode",
                          fix="use one of: auto, leader, orchestrator, orchestrator_prespawn")
    placements = []
    next_rank = 1  # rank 0 is the orchestrator
    for role in roles:
        pids = None
        if mode == "orchestrator_prespawn":
            pids = tuple(range(next_rank, next_rank + ranks[role]))
            next_rank += ranks[role]
        placements.append(Placement(
            model=ENGINE_MODELS[role], role=role, ranks=ranks[role], gpu_device_ids=tuple(devices[role]),
            participant_ids=pids, fast_logits=fast and mode == "orchestrator_prespawn" and role in ("draft", "target"),
        ))
    world = {"leader": ranks[roles[0]], "orchestrator": 1, "orchestrator_prespawn": next_rank}[mode]
    gpus = tuple(sorted({i for p in placements for i in p.gpu_device_ids}))
    return Layout(mode=mode, world_size=world, placements=tuple(placements), gpus=gpus)


def layout_for(recipe, build=None) -> Layout:
    """The layout of a recipe's deployment (``build``: its TrtllmBuild, for the TRT-LLM runtimes)."""
    runtime = recipe.runtime.backend
    if runtime == "trtllm-engine":
        if build is None:
            raise ConfigError("runtime.backend", runtime, "an engine deployment is laid out from its build",
                              fix="pass the build hand-off (trtspec build / --build-dir)")
        return engine_layout(build, recipe.runtime.trtllm.launch_mode)
    if runtime == "trtllm-pytorch":
        world = recipe.limits.world_size
        if world > 1:
            raise ConfigError(
                "limits.tensor_parallel_size", recipe.limits.tensor_parallel_size,
                "multi-GPU serving of the LLM-API flow under Triton is not planned by trtspec "
                "(TRT-LLM starts those ranks itself, through trtllm-llmapi-launch)",
                fix="use runtime.backend: trtllm-engine for tensor/pipeline parallelism, or serve with the "
                    "build's trtllm-serve command")
        ids = tuple(build.gpu_device_ids) if build is not None and build.gpu_device_ids else (0,)
        return Layout(mode="single", world_size=1, gpus=ids)
    # torch runtime: one process on the CPU or on cuda:0
    return Layout(mode="single", world_size=1, gpus=() if recipe.runtime.device == "cpu" else (0,))


def placement_parameters(build, recipe: Mapping[str, Any] | Any, role: str) -> dict[str, str]:
    """``gpu_device_ids`` / ``participant_ids`` (/ fast logits) of one engine, for the renderer.

    ``recipe``: the recipe, or its dict (:class:`~trtspec.triton.render.ServingInputs` carries a dict).
    """
    if isinstance(recipe, Mapping):
        mode = ((recipe.get("runtime") or {}).get("trtllm") or {}).get("launch_mode", "auto")
    else:
        mode = recipe.runtime.trtllm.launch_mode
    return engine_layout(build, mode).placement(role).parameters()
