"""Multi-GPU serving: tritonserver under MPI, launched the way NVIDIA's ``launch_triton_server.py`` does.

A TRT-LLM engine built for tp x pp GPUs runs as tp x pp MPI ranks. NVIDIA's tensorrtllm backend
serves engines in one of three ways (tensorrtllm_backend ``scripts/launch_triton_server.py`` and
``docs/model_config.md``; reference/trtllm-triton.md §2.4-2.5); trtspec adds a fourth for
repositories without engines:

``leader``                 one engine. mpirun starts tp x pp tritonservers. Rank 0 loads the whole
                           repository and serves; ranks > 0 load only the engine model
                           (``--model-control-mode=explicit --load-model=...``) and work inside it.
``orchestrator``           several engines (draft + target, or speculative + baseline). mpirun starts one
                           tritonserver with ``TRTLLM_ORCHESTRATOR=1``; TRT-LLM spawns each engine's
                           ranks on that model's ``gpu_device_ids``.
``orchestrator_prespawn``  the same, but mpirun starts every rank up front (``--disable-spawn-processes``):
                           world size 1 + the ranks of every engine. Rank 0 orchestrates; each engine's
                           config lists its ranks in ``participant_ids``, the draft's first (as in the
                           draft-target docs). Fast draft logits (``speculative_decoding_fast_logits``)
                           need this mode.
``single``                 no engine (torch runtime, LLM API): one tritonserver process, no MPI.

Everything up to :class:`LaunchPlan` is pure and golden-tested: :func:`layout_for` says what runs
where, :func:`launch_plan` turns that into argv. The repository renderer takes each engine's
``gpu_device_ids`` / ``participant_ids`` from the same :class:`Layout` (:func:`placement_parameters`),
and :func:`plan_for_repository` re-checks a rendered repository against it, so the command and the
model configs cannot disagree. :class:`MpiTritonServer` runs a plan through the project's server
launcher (:class:`~trtspec.triton.server.TritonServer`: readiness, failure reasons from the log,
graceful stop, shared-memory cleanup).

Where this differs from ``launch_triton_server.py``, on purpose:

- ranks > 0 open no endpoint (``--allow-http/grpc/metrics=false``). Upstream passes them rank 0's
  ports, which works only because worker ranks never finish loading; here a worker can never take
  rank 0's port.
- environment variables ride on every app context as ``-x NAME=VALUE`` (OpenMPI applies ``-x`` only
  to the context it precedes), so the printed command is complete: copied into a shell it runs the same.
- mpirun is called by name, as upstream does: called by absolute path, OpenMPI acts as if given
  ``--prefix`` and puts its own ``bin``/``lib`` first on every rank's PATH and LD_LIBRARY_PATH.
- the multi-model memory-pool flags name the GPUs the engines use (the recipe's ids), not every GPU
  ``nvidia-smi`` lists; the command does not end in a dangling ``:``.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
from dataclasses import dataclass, field
from typing import Any, Mapping

from trtspec.errors import ConfigError, ServerError
from trtspec.triton.access import restricted_args
from trtspec.triton.server import TritonServer
from trtspec.triton_paths import pytriton_dist

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


# --------------------------------------------------------------------------------------------
# the command


@dataclass(frozen=True)
class LaunchPlan:
    """The exact command that serves a repository, and what each rank does."""

    layout: Layout
    repository: str
    host: str
    grpc_port: int
    http_port: int
    metrics_port: int
    ranks: tuple[tuple[str, ...], ...]  # each rank's tritonserver argv
    argv: tuple[str, ...]  # the whole command (mpirun ... : ..., or the single tritonserver)
    shm_prefixes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.layout.to_dict(),
            "repository": self.repository,
            "endpoints": {"grpc": f"{self.host}:{self.grpc_port}", "http": f"http://{self.host}:{self.http_port}",
                          "metrics": f"http://{self.host}:{self.metrics_port}/metrics"},
            "shm_prefixes": list(self.shm_prefixes),
            "ranks": [list(r) for r in self.ranks],
            "argv": list(self.argv),
        }

    def describe(self) -> str:
        """The plan as text: mode, world, each engine's GPUs and ranks, endpoints, the command."""
        lay = self.layout
        lines = [f"launch: {lay.mode}, MPI world size {lay.world_size}, GPUs {list(lay.gpus) or 'none'}",
                 f"repository: {self.repository}"]
        for p in lay.placements:
            ranks = f", MPI ranks {list(p.participant_ids)}" if p.participant_ids is not None else ""
            fast = ", fast draft logits" if p.fast_logits else ""
            lines.append(f"  engine {p.model} ({p.role}): {p.ranks} rank(s) on GPUs {list(p.gpu_device_ids)}{ranks}{fast}")
        if lay.mode == "leader":
            lines.append(f"  rank 0 serves the whole repository; ranks 1..{lay.world_size - 1} load "
                         f"{', '.join(lay.engine_models)} only" if lay.world_size > 1 else "  rank 0 serves")
        elif lay.mode == "orchestrator":
            lines.append("  one tritonserver orchestrates; TRT-LLM spawns each engine's ranks")
        elif lay.mode == "orchestrator_prespawn":
            lines.append(f"  rank 0 orchestrates and serves; ranks 1..{lay.world_size - 1} are the engines' workers")
        if lay.env:
            lines.append("  env: " + " ".join(f"{k}={v}" for k, v in lay.env))
        lines.append(f"  endpoints: gRPC {self.host}:{self.grpc_port}, HTTP {self.host}:{self.http_port}, "
                     f"metrics {self.host}:{self.metrics_port}")
        lines.append("command:")
        lines.append("  " + _pretty(self.argv))
        return "\n".join(lines) + "\n"


def _pretty(argv: tuple[str, ...]) -> str:
    """The command, one MPI app context per line (still one valid shell command)."""
    out, cur = [], []
    for a in argv:
        if a == ":":
            out.append(shlex.join(cur))
            cur = [":"]
        else:
            cur.append(a)
    out.append(shlex.join(cur))
    return " \\\n    ".join(out)


def launch_plan(
    layout: Layout,
    *,
    repository: str,
    host: str = "0.0.0.0",
    grpc_port: int = 8001,
    http_port: int = 8000,
    metrics_port: int = 8002,
    tritonserver: str = "tritonserver",
    mpirun: str = "mpirun",
    shm_prefix: str = "prefix",
    exit_timeout: int | None = None,
    log_verbose: int | None = None,
    extra_args: tuple[str, ...] = (),
    oversubscribe: bool = False,
) -> LaunchPlan:
    """argv for ``layout`` serving ``repository`` (pure). Defaults are launch_triton_server.py's:
    ports 8000/8001/8002 and shared-memory prefixes ``prefix{rank}_``."""
    if layout.mode not in MODES:
        raise ConfigError("runtime.trtllm.launch_mode", layout.mode, f"unknown launch mode; one of {', '.join(MODES)}")
    prefixes = tuple(f"{shm_prefix}{i}_" for i in range(layout.world_size))
    ranks = []
    for i in range(layout.world_size):
        argv = [tritonserver, f"--model-repository={repository}"]
        if i == 0:
            argv += [f"--http-address={host}", f"--http-port={http_port}",
                     f"--grpc-address={host}", f"--grpc-port={grpc_port}",
                     f"--metrics-address={host}", f"--metrics-port={metrics_port}"]
        else:
            argv += ["--model-control-mode=explicit", *(f"--load-model={m}" for m in layout.engine_models),
                     "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
        if exit_timeout is not None:
            argv.append(f"--exit-timeout-secs={exit_timeout}")
        if layout.mode == "orchestrator":
            # the orchestrator process itself runs no engine: no pinned or CUDA pools, no peer access
            argv += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false",
                     *(f"--cuda-memory-pool-byte-size={g}:0" for g in layout.gpus)]
        argv += ["--disable-auto-complete-config", f"--backend-config=python,shm-region-prefix-name={prefixes[i]}"]
        if log_verbose is not None and i == 0:
            argv.append(f"--log-verbose={log_verbose}")
        argv += list(extra_args)
        ranks.append(tuple(argv))
    if layout.mode == "single":
        cmd: list[str] = list(ranks[0])
    else:
        cmd = [mpirun, "--allow-run-as-root"] + (["--oversubscribe"] if oversubscribe else [])
        for i, argv in enumerate(ranks):
            if i:
                cmd.append(":")
            cmd += ["-n", "1"]
            for k, v in layout.env:
                cmd += ["-x", f"{k}={v}"]
            cmd += argv
    return LaunchPlan(layout=layout, repository=repository, host=host, grpc_port=grpc_port, http_port=http_port,
                      metrics_port=metrics_port, ranks=tuple(ranks), argv=tuple(cmd), shm_prefixes=prefixes)


# --------------------------------------------------------------------------------------------
# a rendered repository


def repository_layout(repository: str | os.PathLike) -> tuple[Layout, dict[str, Any]]:
    """(layout, repository manifest) of a repository ``trtspec package`` rendered; its engine models'
    ``gpu_device_ids`` / ``participant_ids`` must be the layout's."""
    from trtspec.config import parse_recipe
    from trtspec.triton.render import parse_model_config, read_repository_manifest
    from trtspec.trtllm.handoff import TrtllmBuild

    repo = pathlib.Path(repository)
    manifest = read_repository_manifest(repo)
    if manifest is None:
        raise ServerError(f"{repo} is not a repository trtspec rendered (no trtspec.json of kind triton-repository)",
                          fix="render one with: trtspec package CONFIG -o REPO")
    recipe = parse_recipe(manifest["recipe"], source=f"{repo}/trtspec.json")
    build = TrtllmBuild.from_dict(manifest["trtllm_build"]) if manifest.get("trtllm_build") else None
    layout = layout_for(recipe, build)
    engines = {}
    for cfg_path in sorted(repo.glob("*/config.pbtxt")):
        cfg = parse_model_config(cfg_path.read_text(), source=str(cfg_path))
        if cfg.backend == "tensorrtllm":
            engines[cfg_path.parent.name] = {k: v.string_value for k, v in cfg.parameters.items()}
    wanted = {p.model: p for p in layout.placements}
    if set(engines) != set(wanted):
        raise ServerError(
            f"{repo}: engine models {sorted(engines) or 'none'} do not match the launch layout's "
            f"{sorted(wanted) or 'none'}",
            fix="re-render the repository with this trtspec: trtspec package CONFIG -o REPO --force")
    for name, placement in wanted.items():
        for key, value in placement.parameters().items():
            have = engines[name].get(key)
            if have != value:
                raise ServerError(
                    f"{repo}/{name}/config.pbtxt: {key} is {have!r}, the {layout.mode} launch needs {value!r}",
                    fix="re-render the repository (trtspec package CONFIG -o REPO --force); do not edit placements "
                        "by hand: set runtime.trtllm.gpu_device_ids / launch_mode in the recipe")
    return layout, manifest


def plan_for_repository(repository: str | os.PathLike, **kwargs) -> LaunchPlan:
    """The launch plan for a rendered repository; ``kwargs`` as :func:`launch_plan`."""
    layout, _ = repository_layout(repository)
    return launch_plan(layout, repository=str(pathlib.Path(repository).resolve()), **kwargs)


# --------------------------------------------------------------------------------------------
# running it


class MpiTritonServer(TritonServer):
    """:class:`TritonServer` whose command is a :class:`LaunchPlan`: ``mpirun`` with one tritonserver
    per rank (or the single tritonserver). Readiness, failure reasons and the graceful stop are the
    base class's; each rank's python backend gets its own shared-memory prefix under this server's."""

    def __init__(self, repository: str | os.PathLike, layout: Layout, *, mpirun: str | None = None,
                 oversubscribe: bool = False, **kwargs):
        super().__init__(repository, **kwargs)
        self.layout = layout
        self.mpirun = mpirun
        self.oversubscribe = oversubscribe
        self.plan: LaunchPlan | None = None

    def start(self) -> "MpiTritonServer":
        if self.layout.mode != "single" and not (self.mpirun or shutil.which("mpirun")):
            raise ServerError(
                f"mpirun not found: the {self.layout.mode} launch runs {self.layout.world_size} MPI rank(s)",
                fix="serve engine repositories inside NVIDIA's Triton TRT-LLM container (docs/trtllm.md), "
                    "or print the plan with: trtspec serve REPO --dry-run")
        super().start()
        return self

    def command(self, backends: pathlib.Path | None) -> list[str]:
        # by name, as launch_triton_server.py does: OpenMPI called by absolute path acts as --prefix
        # and puts <prefix>/bin and <prefix>/lib first on every rank's PATH and LD_LIBRARY_PATH
        mpirun = self.mpirun or "mpirun"
        extra: list[str] = []
        if backends is not None:  # the CPU tritonserver from nvidia-pytriton (see server.py)
            extra.append(f"--backend-directory={backends}")
            dist = pytriton_dist()
            if dist is not None and (dist / "caches").is_dir():
                extra.append(f"--cache-directory={dist / 'caches'}")
        e = self.endpoints
        self.plan = launch_plan(
            self.layout, repository=str(self.repository), host=e.host, grpc_port=e.grpc_port,
            http_port=e.http_port, metrics_port=e.metrics_port, tritonserver=str(self.binary),
            mpirun=mpirun, shm_prefix=self.shm_prefix, exit_timeout=self.exit_timeout,
            log_verbose=self.log_verbose, extra_args=(*extra, *restricted_args(self.secret), *(self.tls.args() if self.tls else ()),
                        *self.extra_args),
            oversubscribe=self.oversubscribe,
        )
        return list(self.plan.argv)


def with_repository_layout(server: TritonServer) -> TritonServer:
    """``server`` itself for a single-process repository; for a repository of TRT-LLM engines, an
    :class:`MpiTritonServer` with the same settings (address, ports, timeouts, binary, work folder)
    that launches the repository's layout. ``server`` must not be started yet."""
    if server.proc is not None:
        raise ServerError("with_repository_layout() needs a server that has not started")
    from trtspec.triton.render import read_repository_manifest

    if read_repository_manifest(server.repository) is None:  # not rendered by trtspec: served as it is
        return server
    layout, _ = repository_layout(server.repository)
    if layout.mode == "single":
        return server
    grpc_port, http_port, metrics_port = server.ports
    return MpiTritonServer(
        server.repository, layout, host=server.host, grpc_port=grpc_port, http_port=http_port,
        metrics_port=metrics_port, ready_timeout=server.ready_timeout, exit_timeout=server.exit_timeout,
        binary=server.binary, workdir=server.workdir_arg, log_verbose=server.log_verbose,
        extra_args=server.extra_args, tls=server.tls,
    )


def planned_launch(server: TritonServer) -> LaunchPlan:
    """What ``server.start()`` would run, without running anything (``trtspec serve --dry-run``).

    Ports left at 0 (a free port at start) are shown as Triton's defaults 8001/8000/8002, and the
    python-backend shared-memory prefixes as launch_triton_server.py's ``prefix{rank}_``.
    """
    from trtspec.triton.render import read_repository_manifest

    if isinstance(server, MpiTritonServer):
        layout = server.layout
    elif read_repository_manifest(server.repository) is not None:
        layout, _ = repository_layout(server.repository)
    else:
        layout = Layout(mode="single", world_size=1)
    grpc_port, http_port, metrics_port = server.ports
    extra = (*restricted_args("<per-launch secret>"), *server.extra_args)
    if layout.mode == "single" and getattr(server, "watchdog_settings", None) is not None:
        # as TritonServer.command(): the watchdog's model repository lives in the work folder
        extra = ("--model-control-mode=explicit", "--load-model=*",
                 "--model-repository=<work folder>/watchdog_repository", *extra)
    return launch_plan(
        layout, repository=str(server.repository), host=server.host, grpc_port=grpc_port or 8001,
        http_port=http_port or 8000, metrics_port=metrics_port or 8002,
        tritonserver=str(server.binary) if server.binary else "tritonserver",
        mpirun=getattr(server, "mpirun", None) or "mpirun", exit_timeout=server.exit_timeout,
        log_verbose=server.log_verbose, extra_args=extra,
    )
