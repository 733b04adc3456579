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
launcher (:class:`~trtspec.triton.launch.server.TritonServer`: readiness, failure reasons from the log,
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
import sys
from dataclasses import dataclass, field
from typing import Any

from trtspec.config import parse_recipe
from trtspec.errors import ConfigError, ServerError
from trtspec.triton.launch.server import TritonServer
from trtspec.triton.launch.paths import pytriton_dist
from trtspec.triton.placement import MODES, Layout, layout_for
from trtspec.triton.render import parse_model_config, read_repository_manifest
from trtspec.trtllm.handoff import TrtllmBuild
from trtspec.triton.access import (SHIM_FALLBACK_WARNING, argv_shim, hidden_restricted_args, is_loopback,
                                   placeholder_env, restricted_args)


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
    http_host: str | None = None  # where HTTP binds when not on host (127.0.0.1 under TLS)
    # tritonserver's environment beyond the caller's: the argv shim (LD_PRELOAD) and the names of the
    # variables its placeholders read (their values come from the launcher's environment, never argv)
    env: tuple[tuple[str, str | None], ...] = field(default=())
    controls: tuple[str, ...] = field(default=())  # what the launch does about each security control

    @property
    def http_address(self) -> str:
        return self.http_host or self.host

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.layout.to_dict(),
            "repository": self.repository,
            "endpoints": {"grpc": f"{self.host}:{self.grpc_port}", "http": f"http://{self.http_address}:{self.http_port}",
                          "metrics": f"http://{self.host}:{self.metrics_port}/metrics"},
            "shm_prefixes": list(self.shm_prefixes),
            **({"server_env": {k: v for k, v in self.env}} if self.env else {}),
            **({"controls": list(self.controls)} if self.controls else {}),
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
        lines.append(f"  endpoints: gRPC {self.host}:{self.grpc_port}, HTTP {self.http_address}:{self.http_port}, "
                     f"metrics {self.host}:{self.metrics_port}")
        if self.env:
            lines.append("  server env: " + " ".join(k if v is None else f"{k}={v}" for k, v in self.env)
                         + "  (names alone: values from the launcher's environment)")
        if self.controls:
            lines.append("controls:")
            lines += [f"  {c}" for c in self.controls]
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
    http_host: str | None = None,
    argv_shim: str | None = None,
    controls: tuple[str, ...] = (),
) -> LaunchPlan:
    """argv for ``layout`` serving ``repository`` (pure). Defaults are launch_triton_server.py's:
    ports 8000/8001/8002 and shared-memory prefixes ``prefix{rank}_``.

    ``http_host``: where rank 0's HTTP binds instead of ``host`` (127.0.0.1 under TLS: Triton 2.51 has
    no HTTP TLS). ``argv_shim``: the library that fills the ``@trtspec@`` placeholders of
    ``extra_args`` (trtspec.triton.access.hidden): every app context gets ``-x LD_PRELOAD=...`` and
    ``-x NAME`` for each variable the placeholders read (mpirun passes its own value: never on a
    command line); mpirun itself never loads it. ``controls``: lines the plan shows."""
    if layout.mode not in MODES:
        raise ConfigError("runtime.trtllm.launch_mode", layout.mode, f"unknown launch mode; one of {', '.join(MODES)}")
    prefixes = tuple(f"{shm_prefix}{i}_" for i in range(layout.world_size))
    ranks = []
    for i in range(layout.world_size):
        argv = [tritonserver, f"--model-repository={repository}"]
        if i == 0:
            argv += [f"--http-address={http_host or host}", f"--http-port={http_port}",
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
    names = placeholder_env(extra_args)
    env: list[tuple[str, str | None]] = []
    if argv_shim is not None and names:
        env = [("LD_PRELOAD", argv_shim), *((n, None) for n in names)]
    if layout.mode == "single":
        cmd: list[str] = list(ranks[0])
    else:
        cmd = [mpirun, "--allow-run-as-root"] + (["--oversubscribe"] if oversubscribe else [])
        for i, argv in enumerate(ranks):
            if i:
                cmd.append(":")
            cmd += ["-n", "1"]
            for k, v in (*layout.env, *env):
                cmd += ["-x", k if v is None else f"{k}={v}"]
            cmd += argv
    return LaunchPlan(layout=layout, repository=repository, host=host, grpc_port=grpc_port, http_port=http_port,
                      metrics_port=metrics_port, ranks=tuple(ranks), argv=tuple(cmd), shm_prefixes=prefixes,
                      http_host=http_host, env=tuple(env), controls=tuple(controls))


# --------------------------------------------------------------------------------------------
# a rendered repository


def repository_layout(repository: str | os.PathLike) -> tuple[Layout, dict[str, Any]]:
    """(layout, repository manifest) of a repository ``trtspec package`` rendered; its engine models'
    ``gpu_device_ids`` / ``participant_ids`` must be the layout's."""

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


WATCHDOG_MPI = ("watchdog: off: it cannot reload the ranks of an MPI world (an engine model's ranks load "
                "together; rank 0 alone cannot reload it); a dead python stub is covered by the liveness probe "
                "(trtspec deploy k8s) or by restarting trtspec serve")


def launch_controls(server: TritonServer, layout: Layout, *, http_host: str | None, shim: str | None,
                    shim_warning: str | None) -> tuple[str, ...]:
    """What a launch does about each control of docs/security.md: the plan prints them."""
    rh = getattr(server, "required_header", None)
    tls = getattr(server, "tls", None)
    ranks = " on every rank" if layout.world_size > 1 else ""
    out = [f"admin APIs (model-repository, shared-memory, trace, logging): need this launch's secret{ranks}",
           (f"required header: {rh.name} on inference, metadata, model config, statistics{ranks} "
            f"(value from $TRTSPEC_REQUIRED_HEADER_VALUE)") if rh is not None
           else "required header: none (serving.require_header or serve --require-header)",
           f"TLS: gRPC{' with mutual TLS' if tls is not None and tls.ca else ''}" if tls is not None else "TLS: none",
           f"bind: gRPC and metrics on {server.host}, HTTP on {http_host or server.host}"
           + (" (Triton 2.51 has no HTTP TLS)" if http_host else "")
           + ("; ranks > 0 open no endpoint" if layout.world_size > 1 else "")]
    if shim is not None:
        out.append("secrets on the command line: none (placeholders filled from the environment by the argv shim)")
    else:
        out.append(f"secrets on the command line: YES: {shim_warning}")
    if layout.mode != "single":
        out.append(WATCHDOG_MPI)
    elif getattr(server, "watchdog_settings", None) is not None:
        out.append("watchdog: on (explicit model control; reloads a model whose python stub died)")
    else:
        out.append("watchdog: off")
    return tuple(out)


def _tls_http_host(server: TritonServer) -> str | None:
    """Triton's HTTP has no TLS: under TLS it binds 127.0.0.1 (as TritonServer.start does)."""
    return "127.0.0.1" if getattr(server, "tls", None) is not None and not is_loopback(server.host) else None


def _secret_args(server: TritonServer, hide: bool, secret: str) -> list[str]:
    out = hidden_restricted_args() if hide else restricted_args(secret)
    if getattr(server, "required_header", None) is not None:
        out += server.required_header.args(hide=hide)
    return out


class MpiTritonServer(TritonServer):
    """:class:`TritonServer` whose command is a :class:`LaunchPlan`: ``mpirun`` with one tritonserver
    per rank (or the single tritonserver). Readiness, failure reasons and the graceful stop are the
    base class's; each rank's python backend gets its own shared-memory prefix under this server's.
    Every rank gets the admin secret and the required header (as placeholders the argv shim fills,
    ``-x``-exported to each rank), rank 0 the TLS flags and the bind addresses (HTTP on 127.0.0.1
    under TLS). There is no watchdog (:data:`WATCHDOG_MPI`)."""

    def __init__(self, repository: str | os.PathLike, layout: Layout, *, mpirun: str | None = None,
                 oversubscribe: bool = False, **kwargs):
        self.watchdog_declined = kwargs.pop("watchdog", None) is not None
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
        if self.watchdog_declined:
            print(f"note: {WATCHDOG_MPI}", file=sys.stderr, flush=True)
        super().start()
        return self

    def server_env(self) -> dict[str, str]:
        env = super().server_env()
        if self.argv_shim is not None and self.layout.mode != "single":
            env.pop("LD_PRELOAD", None)  # the ranks get it with -x; mpirun itself never loads it
        return env

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
        shim = str(self.argv_shim) if self.argv_shim is not None else None
        self.plan = launch_plan(
            self.layout, repository=str(self.repository), host=e.host, grpc_port=e.grpc_port,
            http_port=e.http_port, metrics_port=e.metrics_port, tritonserver=str(self.binary),
            mpirun=mpirun, shm_prefix=self.shm_prefix, exit_timeout=self.exit_timeout,
            log_verbose=self.log_verbose,
            extra_args=(*extra, *_secret_args(self, shim is not None, self.secret),
                        *(self.tls.args() if self.tls else ()), *self.extra_args),
            oversubscribe=self.oversubscribe, http_host=e.http_host, argv_shim=shim,
            controls=launch_controls(self, self.layout, http_host=e.http_host, shim=shim,
                                     shim_warning=self.argv_shim_warning),
        )
        return list(self.plan.argv)


def with_repository_layout(server: TritonServer) -> TritonServer:
    """``server`` itself for a single-process repository; for a repository of TRT-LLM engines, an
    :class:`MpiTritonServer` with the same settings (address, ports, timeouts, binary, work folder,
    TLS, required header, passthrough) that launches the repository's layout, without the watchdog
    (:data:`WATCHDOG_MPI`; ``trtspec serve`` says so). ``server`` must not be started yet."""
    if server.proc is not None:
        raise ServerError("with_repository_layout() needs a server that has not started")

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
        extra_args=server.extra_args, tls=server.tls, required_header=server.required_header,
        watchdog=server.watchdog_settings, entry_points=server.entry_points, on_progress=server.on_progress,
    )


def planned_launch(server: TritonServer) -> LaunchPlan:
    """What ``server.start()`` would run, without running anything (``trtspec serve --dry-run``):
    every rank's controls (admin secret, required header, TLS, bind addresses, the watchdog or why
    not) and the argv shim that keeps the secrets off the command line (built here if needed, as
    the start would).

    Ports left at 0 (a free port at start) are shown as Triton's defaults 8001/8000/8002, and the
    python-backend shared-memory prefixes as launch_triton_server.py's ``prefix{rank}_``.
    """

    if isinstance(server, MpiTritonServer):
        layout = server.layout
    elif read_repository_manifest(server.repository) is not None:
        layout, _ = repository_layout(server.repository)
    else:
        layout = Layout(mode="single", world_size=1)
    grpc_port, http_port, metrics_port = server.ports
    shim_path, why = argv_shim()
    shim = str(shim_path) if shim_path is not None else None
    why = None if shim else why
    http_host = _tls_http_host(server)
    extra = (*_secret_args(server, shim is not None, "<per-launch secret>"),
             *(server.tls.args() if getattr(server, "tls", None) is not None else ()), *server.extra_args)
    if layout.mode == "single" and getattr(server, "watchdog_settings", None) is not None:
        # as TritonServer.command(): the watchdog's model repository lives in the work folder
        extra = ("--model-control-mode=explicit", "--load-model=*",
                 "--model-repository=<work folder>/watchdog_repository", *extra)
    return launch_plan(
        layout, repository=str(server.repository), host=server.host, grpc_port=grpc_port or 8001,
        http_port=http_port or 8000, metrics_port=metrics_port or 8002,
        tritonserver=str(server.binary) if server.binary else "tritonserver",
        mpirun=getattr(server, "mpirun", None) or "mpirun", exit_timeout=server.exit_timeout,
        log_verbose=server.log_verbose, extra_args=extra, http_host=http_host, argv_shim=shim,
        controls=launch_controls(server, layout, http_host=http_host, shim=shim,
                                 shim_warning=SHIM_FALLBACK_WARNING.format(why=why) if why else None),
    )
