"""Launch a real ``tritonserver`` on a model repository: :class:`TritonServer`.

Which binary: ``tritonserver`` on PATH (NVIDIA's container, with its own backends), else the one
bundled in ``nvidia-pytriton==0.7.0`` (Triton 2.51, CPU). For the bundled one the python backend
needs a private ``backends/python`` folder of *symlinks* (a copied stub loses its RPATH), the
project venv's ``bin`` first on PATH (the stub takes its Python from there: numpy<2 is required,
numpy 2 silently zeroes tensors) and ``LD_LIBRARY_PATH`` = this interpreter's LIBDIR (so the
stub's libpython matches the venv's stdlib). See reference/triton-cpu.md §1.

Lifecycle: the server runs in its own process group; readiness is polled with a bounded timeout
(a python stub that cannot start makes model loading hang forever); a model that fails to load
is reported by name with the reason from the server log; :meth:`stop` sends SIGTERM (graceful:
in-flight requests drain), then kills the whole group and removes what the python backend leaves
behind when a server does not exit cleanly: its shared-memory files
(``/dev/shm/<shm-region-prefix-name>*``) and its ``/tmp/python_env_*`` folder (a path the backend
hard-codes). Each running server is recorded in this user's private state folder
(``trtspec.triton.launch.state``: ``$XDG_RUNTIME_DIR/trtspec`` or ``$TMPDIR/trtspec-<uid>``); a later start
cleans up after servers whose launcher was killed before it could (``sweep_leftovers``), deleting
only names trtspec creates, of this user.

With ``watchdog=WatchdogSettings()`` the server runs under explicit model control (every model
loaded at start) and a :class:`~trtspec.triton.launch.watchdog.Watchdog` reloads models whose python stub
died (docs/reliability.md).

Every launch closes Triton's model-repository, shared-memory, trace and logging APIs behind a
secret made for it (``trtspec.triton.access``; docs/security.md): :attr:`TritonServer.secret`. The
secret and the required header's value are on no command line: tritonserver gets placeholders
that the preloaded argv shim fills from its environment (:meth:`TritonServer.secret_args`; without
a C compiler, the values, with a warning). ``serving.tritonserver_args`` that widen exposure need
``serving.unsafe_passthrough`` (checked again here, from the repository's ``trtspec.json``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pathlib
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from trtspec.errors import ConfigError, ServerError
from trtspec.passthrough import check_tritonserver_args
from trtspec.resources import templates_dir
from trtspec.triton.launch.paths import pytriton_dist
from trtspec.triton.launch.watchdog import WATCHDOG_MODEL, WatchdogSettings
from trtspec.triton.render import read_repository_manifest
from trtspec.triton.launch.watchdog import Watchdog, watchdog_config
from trtspec.client.targets import ClientOptions, TLSOptions
from trtspec.triton.access import (INTERNAL_ENV, REQUIRED_HEADER_ENV, SECRET_ENV, SHIM_FALLBACK_WARNING, InternalClient,
                                   RequiredHeader, TlsSettings, argv_shim, hidden_restricted_args, is_loopback,
                                   new_secret, resolve_host, restricted_args)
from trtspec.triton.launch.state import owned_python_env, read_records, start_lock, state_dir, write_record

SHM_DIR = pathlib.Path("/dev/shm")
# the python backend's EnvironmentManager makes one mkdtemp("/tmp/python_env_XXXXXX") per server
# and removes it only on a clean exit; the path ignores TMPDIR
PYTHON_ENV_GLOB = "/tmp/python_env_*"


@dataclass(frozen=True)
class Endpoints:
    host: str
    grpc_port: int
    http_port: int
    metrics_port: int
    http_host: str | None = None  # where HTTP binds when not on host (127.0.0.1 under TLS)

    @property
    def grpc(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http(self) -> str:
        return f"http://{self.http_host or self.host}:{self.http_port}"

    @property
    def metrics(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def to_dict(self) -> dict:
        return {"grpc": self.grpc, "http": self.http, "metrics": self.metrics}


_GIVEN: set[int] = set()  # ports this process handed out from TRTSPEC_PORT_RANGE


def port_range() -> tuple[int, int] | None:
    """``TRTSPEC_PORT_RANGE=LO-HI``: the ports trtspec picks for itself (a firewall's open range, or
    one range per test worker so that parallel runs never pick the same port); None = the kernel's."""
    raw = os.environ.get("TRTSPEC_PORT_RANGE", "").strip()
    if not raw:
        return None
    try:
        lo, hi = (int(x) for x in raw.split("-"))
    except ValueError:
        lo = hi = -1
    if not 1024 <= lo < hi <= 65535:
        raise ConfigError("TRTSPEC_PORT_RANGE", raw, "must be LO-HI with 1024 <= LO < HI <= 65535",
                          fix="e.g. TRTSPEC_PORT_RANGE=20000-20999, or unset it to let the kernel pick")
    return lo, hi


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on: the kernel's pick, or a free one of ``TRTSPEC_PORT_RANGE``."""
    rng = port_range()
    if rng is None:
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    lo, hi = rng
    for port in random.sample(range(lo, hi + 1), min(hi - lo + 1, 512)):
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise ConfigError("TRTSPEC_PORT_RANGE", f"{lo}-{hi}", "no free port in the range",
                      fix="widen the range or free some of its ports")


def find_tritonserver() -> tuple[pathlib.Path, bool]:
    """(binary, bundled): tritonserver on PATH first, else nvidia-pytriton's."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return pathlib.Path(on_path), False
    dist = pytriton_dist()
    if dist is not None and (dist / "bin" / "tritonserver").is_file():
        return dist / "bin" / "tritonserver", True
    raise ServerError(
        "no tritonserver found: not on PATH and nvidia-pytriton is not installed",
        fix="pip install nvidia-pytriton==0.7.0 (CPU, bundled server), or run inside NVIDIA's Triton container",
    )


def prepare_backends(dst: pathlib.Path) -> pathlib.Path:
    """``dst/backends/python`` = symlinks to the bundled python backend and this Python's stub."""
    dist = pytriton_dist()
    if dist is None:
        raise ServerError("nvidia-pytriton is not installed", fix="pip install nvidia-pytriton==0.7.0")
    ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = dist / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(f"nvidia-pytriton has no python backend stub for Python {ver}",
                          fix="use Python 3.8-3.13")
    py = dst / "backends" / "python"
    py.mkdir(parents=True, exist_ok=True)
    for name, src in {
        "libtriton_python.so": dist / "backends" / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py": dist / "backends" / "python" / "triton_python_backend_utils.py",
        "triton_python_backend_stub": stub,
    }.items():
        link = py / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(src)
    return dst / "backends"


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """PATH with this venv's bin first; LD_LIBRARY_PATH with this interpreter's LIBDIR first."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = libdir + (os.pathsep + old if old else "")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the torch runtime's engine worker processes start with this interpreter (it has trtspec)
    env.setdefault("TRTSPEC_WORKER_PYTHON", sys.executable)
    # With no locale (C/POSIX) the embedded Python of the stubs decodes files as ASCII, and
    # torch/modelopt imports read UTF-8 sources: give the stubs a UTF-8 locale (PYTHONUTF8 alone
    # is not honoured by the embedded interpreter).
    env["PYTHONUTF8"] = "1"
    if "UTF-8" not in (env.get("LC_ALL") or env.get("LC_CTYPE") or env.get("LANG") or "").upper().replace("UTF8", "UTF-8"):
        env["LC_ALL"] = "C.UTF-8"
    return env


# ------------------------------------------------------------------------------------------
# log parsing: which model failed, and why

_FAILED = re.compile(r"failed to load '([^']+)' version \d+: (.*)")
_LOADING = re.compile(r"loading: ([^:\s]+):\d+")
_LOADED = re.compile(r"successfully loaded '([^']+)'")
_TABLE_ROW = re.compile(r"^\|\s*(\S+)\s*\|\s*(\S+)\s*\|\s*(UNAVAILABLE: .*?)\s*\|?\s*$")


def _reason(raw: str) -> str:
    """One readable line from a logged load error: the log escapes newlines and quotes, and a
    python model's error ends with the stub's traceback ("At: ...")."""
    text = raw.strip().rstrip('"').replace("\\n", "\n").replace('\\"', '"')
    text = text.split("\n\nAt:")[0]
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def model_failures(log: str) -> dict[str, str]:
    """{model: reason} for every model the server log says failed to load."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        m = _FAILED.search(line)
        if m:
            out.setdefault(m.group(1), _reason(m.group(2)))
            continue
        m = _TABLE_ROW.match(line.strip())
        if m and m.group(1) != "Model":
            out.setdefault(m.group(1), _reason(m.group(3)[len("UNAVAILABLE: "):]))
    return out


def models_still_loading(log: str) -> list[str]:
    loading, done = [], set()
    for line in log.splitlines():
        if m := _LOADING.search(line):
            loading.append(m.group(1))
        elif m := _LOADED.search(line):
            done.add(m.group(1))
        elif m := _FAILED.search(line):
            done.add(m.group(1))
    return [m for m in dict.fromkeys(loading) if m not in done]


START_ATTEMPTS = 2  # starts of tritonserver when one aborts while loading with a known native abort

# what tritonserver prints, unprefixed, on its way down from a native abort
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'")
# (it prints "Signal (15) received." for a stop request too: only SIGILL/ABRT/BUS/FPE/SEGV are aborts)
_SIGNAL = re.compile(r"^Signal \(([4678]|11)\) received\.", re.M)
# aborts whose cause is known (measured here), and what they mean for the deployment
KNOWN_ABORTS = {
    "boost::interprocess::lock_exception": (
        "Triton 2.51's python backend aborts the whole server when a python stub died while holding one "
        "of its shared-memory locks (a stub killed by SIGKILL or the OOM killer); the watchdog reloads a "
        "dead stub, but cannot stop this abort (docs/reliability.md)"),
}


def _uncaught(log: str) -> str | None:
    """The last uncaught exception tritonserver printed on its way down, if any."""
    return (_TERMINATE.findall(log) or [None])[-1]


def known_abort(log: str) -> str | None:
    """The uncaught exception of a native abort whose cause is known (:data:`KNOWN_ABORTS`), else None."""
    exc = _uncaught(log)
    return exc if exc in KNOWN_ABORTS else None


def native_abort(log: str) -> str | None:
    """What a tritonserver that aborted in native code printed (the uncaught exception and the
    signal), with the known cause when there is one; None when the log shows no abort."""
    sig = _SIGNAL.search(log)
    exc = _uncaught(log)
    if sig is None and exc is None:
        return None
    said = f"tritonserver aborted: {f'uncaught {exc}' if exc else 'a fatal signal'}"
    said += f", signal {sig.group(1)}" if sig else ""
    cause = KNOWN_ABORTS.get(exc)
    return f"{said}: {cause}" if cause else said


def other_errors(log: str, limit: int = 8) -> list[str]:
    """Server-level error lines (``E…`` glog lines and ``error:``), without the CPU-only noise."""
    noise = ("CUDA", "NVML", "DCGM", "pinned", "CudaDriverHelper", "cuda")
    lines = [ln.strip() for ln in log.splitlines()
             if (ln.startswith("E") and re.match(r"E\d{4}", ln) or ln.startswith("error:"))
             and not any(n in ln for n in noise)]
    return lines[-limit:]


# ------------------------------------------------------------------------------------------


class TritonServer:
    """A ``tritonserver`` process serving ``repository``; use as a context manager.

    >>> with TritonServer("repo") as server:          # started and ready, or ServerError
    ...     client = grpcclient.InferenceServerClient(server.endpoints.grpc)
    """

    def __init__(
        self,
        repository: str | os.PathLike,
        *,
        host: str = "127.0.0.1",
        grpc_port: int = 0,
        http_port: int = 0,
        metrics_port: int = 0,
        ready_timeout: float = 180.0,
        exit_timeout: int = 10,
        binary: str | os.PathLike | None = None,
        workdir: str | os.PathLike | None = None,
        log_verbose: int = 0,
        extra_args: tuple[str, ...] = (),
        watchdog=None,
        entry_points: tuple[str, ...] = (),
        on_watchdog_event=None,
        tls: TlsSettings | None = None,
        required_header: RequiredHeader | None = None,
        on_progress=None,
    ):
        self.repository = pathlib.Path(repository).resolve()
        if not self.repository.is_dir():
            raise ServerError(f"model repository {self.repository} does not exist",
                              fix="render one with: trtspec package CONFIG -o REPO")
        self.host = host
        self.ports = (grpc_port, http_port, metrics_port)
        self.ready_timeout = ready_timeout
        self.exit_timeout = exit_timeout
        self.binary = pathlib.Path(binary) if binary else None
        self.workdir_arg = pathlib.Path(workdir) if workdir else None
        self.log_verbose = log_verbose
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen | None = None
        self.endpoints: Endpoints | None = None
        self.shm_prefix = f"trtspec{os.getpid()}x{id(self) & 0xFFFFFF:x}_"
        self.workdir: pathlib.Path | None = None
        self.log_path: pathlib.Path | None = None
        self._log = None
        self._own_workdir = False
        self.returncode: int | None = None
        self.watchdog_settings = watchdog  # WatchdogSettings | None
        self.entry_points = tuple(entry_points)
        self.on_watchdog_event = on_watchdog_event
        self.watchdog = None  # the running Watchdog
        self.python_env_dirs: list[pathlib.Path] = []
        self._record: pathlib.Path | None = None
        self.restarts: list[str] = []  # why start() had to start tritonserver again (a known abort while loading)
        # closes the repository/shared-memory/trace/logging APIs; the watchdog and the stubs get it
        self.secret = new_secret()
        self.tls = tls  # gRPC over TLS; HTTP then binds to 127.0.0.1
        if tls is not None:
            tls.check()
        self.required_header = required_header  # a header every inference/metadata call must carry
        # how the server's own clients (router relay, watchdog, OpenAI relay) call its gRPC port
        self.internal_client = InternalClient(
            tls=tls.internal() if tls is not None else None,
            headers=(required_header.grpc_header(),) if required_header is not None else ())
        # (models ready, models in the repository, label) while start() waits: a progress bar
        self.on_progress = on_progress
        # the LD_PRELOAD library that keeps the secrets off the command line (picked at start)
        self.argv_shim: pathlib.Path | None = None
        self.argv_shim_warning: str | None = None

    # ---------------------------------------------------------------- command

    def command(self, backends: pathlib.Path | None) -> list[str]:
        e = self.endpoints
        cmd = [
            str(self.binary),
            f"--model-repository={self.repository}",
            f"--http-address={e.http_host or e.host}", f"--http-port={e.http_port}",
            f"--grpc-address={e.host}", f"--grpc-port={e.grpc_port}",
            f"--metrics-address={e.host}", f"--metrics-port={e.metrics_port}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--exit-timeout-secs={self.exit_timeout}",
            "--disable-auto-complete-config",
            f"--log-verbose={self.log_verbose}",
            *self.secret_args(),
            *(self.tls.args() if self.tls is not None else []),
        ]
        if backends is not None:
            cmd.append(f"--backend-directory={backends}")
            dist = pytriton_dist()
            if dist is not None and (dist / "caches").is_dir():
                cmd.append(f"--cache-directory={dist / 'caches'}")
        if self.watchdog_settings is not None:
            # load/unload need explicit model control; "*" loads every model at start, as before
            cmd += ["--model-control-mode=explicit", "--load-model=*",
                    f"--model-repository={self.workdir / 'watchdog_repository'}"]
        return cmd + list(self.extra_args)

    def secret_args(self) -> list[str]:
        """The restricted-API flags (admin secret, required header): placeholders the argv shim
        fills from the environment when there is one (:attr:`argv_shim`), else the values."""
        hide = self.argv_shim is not None
        out = hidden_restricted_args() if hide else restricted_args(self.secret)
        if self.required_header is not None:
            out += self.required_header.args(hide=hide)
        return out

    def server_env(self) -> dict[str, str]:
        """tritonserver's environment: the stubs' secret and client settings, and the argv shim with
        the values its placeholders read."""
        env = {**server_env(), SECRET_ENV: self.secret, INTERNAL_ENV: self.internal_client.to_env()}
        if self.required_header is not None:
            env[REQUIRED_HEADER_ENV] = self.required_header.value
        if self.argv_shim is not None:
            env["LD_PRELOAD"] = " ".join(p for p in (str(self.argv_shim), env.get("LD_PRELOAD")) if p)
        return env

    def _pick_argv_shim(self) -> None:
        self.argv_shim, why = argv_shim()
        if self.argv_shim is None:
            self.argv_shim_warning = SHIM_FALLBACK_WARNING.format(why=why)
            print(f"warning: {self.argv_shim_warning}", file=sys.stderr, flush=True)

    def client_target(self):
        """(url, ClientOptions) for a trtspec client of this server from the same host (the OpenAI
        relay, ``trtspec run``'s validation): TLS and the required header as the launch set them."""
        ic = self.internal_client
        if ic.tls is None:
            return self.endpoints.grpc, ClientOptions(headers=ic.headers)
        tls = TLSOptions(ca=ic.tls.root, cert=ic.tls.cert, key=ic.tls.key, server_name=ic.tls.server_name)
        return "grpcs://" + self.endpoints.grpc, ClientOptions(tls=tls, headers=ic.headers)

    def _write_watchdog_model(self) -> None:
        d = self.workdir / "watchdog_repository" / WATCHDOG_MODEL
        shutil.rmtree(d, ignore_errors=True)  # the launcher's own work folder: a copy from an earlier start
        shutil.copytree(templates_dir() / WATCHDOG_MODEL, d)
        models = [p.parent.name for p in self.repository.glob("*/config.pbtxt")] + [WATCHDOG_MODEL]
        (d / "config.pbtxt").write_text(watchdog_config((d / "config.pbtxt").read_text(), models))

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> "TritonServer":
        """Start tritonserver and wait until it is ready (ServerError otherwise). A server that
        aborted while loading with a known native abort is started once more: Triton 2.51's
        python stub can crash while the models load and take the server down with
        boost::interprocess::lock_exception (seen on a fresh CI clone, once in many starts;
        docs/reliability.md); a second start is what an orchestrator would do, minutes sooner.
        Any other failure, or the same abort twice, is raised at once. ``restarts`` says why."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return self._start_once()
            except ServerError as e:
                abort = known_abort(self.log_text())
                if abort is None or attempt == START_ATTEMPTS or self.proc is None:
                    raise
                failed_log = self.log_path
                self.restarts.append(f"{abort} while loading: {e.message.splitlines()[0]}")
                print(f"warning: tritonserver aborted while loading ({abort}, a known Triton 2.51 python "
                      f"backend crash); starting it again (attempt {attempt + 1} of {START_ATTEMPTS}); "
                      f"the failed start's log is kept as {failed_log}.1", file=sys.stderr, flush=True)
                self.proc, self._record, self.python_env_dirs, self.watchdog = None, None, [], None
        raise AssertionError("unreachable")

    def _start_once(self) -> "TritonServer":
        if self.proc is not None:
            raise ServerError("this TritonServer was already started")
        if self.binary is None:
            self.binary, bundled = find_tritonserver()
        else:
            dist = pytriton_dist()
            bundled = dist is not None and self.binary.resolve().is_relative_to(dist.resolve())
        binary = self.binary
        if self.workdir_arg is not None:
            self.workdir = self.workdir_arg
            self.workdir.mkdir(parents=True, exist_ok=True)
        elif self._own_workdir:  # a start tried again: the same folder, the failed start's log rotated
            self.workdir.mkdir(parents=True, exist_ok=True)
        else:
            self.workdir = pathlib.Path(tempfile.mkdtemp(prefix="trtspec-triton-"))
            self._own_workdir = True
        backends = prepare_backends(self.workdir) if bundled else None
        if self.watchdog_settings is not None:
            self._write_watchdog_model()
        sweep_leftovers()
        g, h, m = self.ports
        # Triton's HTTP has no TLS: under TLS it stays on loopback (local tools and probes)
        http_host = "127.0.0.1" if self.tls is not None and not is_loopback(self.host) else None
        self.endpoints = Endpoints(self.host, g or free_port(self.host), h or free_port(http_host or self.host),
                                   m or free_port(self.host), http_host=http_host)
        self._pick_argv_shim()  # secrets off the command line (trtspec.triton.access)
        self.log_path = self.workdir / "tritonserver.log"
        rotate_log(self.log_path)  # the last runs' logs stay (a restart must not erase why it stopped)
        self._log = open(self.log_path, "wb")
        self.cmd = self.command(backends)
        with _start_lock():
            before = set(glob_python_envs())
            try:
                # own session/process group: the python stubs are killed with the server
                self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                             env=self.server_env(), start_new_session=True, cwd=self.workdir,
                                             umask=0o077)  # what the server writes is for this user only
            except OSError as e:
                self._log.close()
                raise ServerError(f"cannot start {binary}: {e}") from None
            try:
                self._find_python_env(before)
            except BaseException:
                self.stop()
                raise
        try:
            self._wait_ready()
            tighten_shared_memory(self.shm_prefix)
            if self.watchdog_settings is not None:

                self.watchdog = Watchdog(self.endpoints.grpc, self.proc.pid, self.watchdog_settings,
                                         entry_points=self.entry_points, on_event=self.on_watchdog_event,
                                         secret=self.secret, client=self.internal_client).start()
        except BaseException:
            self.stop()
            raise
        return self

    def _find_python_env(self, before: set[pathlib.Path], timeout: float = 30.0) -> None:
        """Which ``/tmp/python_env_*`` folder this server's python backend made (it appears when
        the first python model loads, right at start). Called under the start lock, so another
        trtspec server starting at the same time cannot make it ambiguous."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            new = sorted(set(glob_python_envs()) - before)
            if new:
                self.python_env_dirs = new
                break
            if self.proc.poll() is not None or self._ready():
                break  # exited, or ready without python models
            time.sleep(0.05)
        self._write_record()

    def _write_record(self) -> None:
        self._record = write_record(state_dir(), self.proc.pid, {
            "server_pid": self.proc.pid, "argv0": self.cmd[0], "launcher_pid": os.getpid(),
            "shm_prefix": self.shm_prefix,
            "python_env_dirs": [str(p) for p in self.python_env_dirs], "workdir": str(self.workdir)})

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_text(self) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoints.http}/v2/health/ready", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _metrics_up(self) -> bool:
        """The metrics port accepts connections (tritonserver opens it after the HTTP port: a
        caller told "ready" must be able to read /metrics), or metrics are turned off."""
        if any(a.replace("_", "-").lower() in ("--allow-metrics=false", "--allow-metrics=0") for a in self.extra_args):
            return True
        try:
            with socket.create_connection((self.endpoints.host, self.endpoints.metrics_port), timeout=1):
                return True
        except OSError:
            return False

    def _model_ready(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoints.http}/v2/models/{name}/ready", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        names = sorted(p.parent.name for p in self.repository.glob("*/config.pbtxt"))
        loaded: set[str] = set()
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise self._failure(f"tritonserver exited (code {rc}) before it was ready")
            if self._ready() and self._metrics_up():
                if self.on_progress:
                    self.on_progress(len(names), len(names), "models ready")
                return
            if self.on_progress and names:
                loaded |= {n for n in names if n not in loaded and self._model_ready(n)}
                self.on_progress(len(loaded), len(names), "models ready")
            time.sleep(0.25)
        raise self._failure(f"tritonserver was not ready within {self.ready_timeout:.0f} s", timeout=True)

    def _failure(self, headline: str, *, timeout: bool = False) -> ServerError:
        log = self.log_text()
        failed = model_failures(log)
        lines = [headline]
        fix = f"read the full log: {self.log_path}"
        if abort := native_abort(log):
            lines.append(abort)
            fix = f"restart the server (trtspec serve exits non-zero so that an orchestrator does); {fix}"
        elif failed:
            lines.append("models that failed to load:")
            lines += [f"  {name}: {_shorten(reason)}" for name, reason in failed.items()]
        elif timeout and (stuck := models_still_loading(log)):
            lines.append(f"still loading: {', '.join(stuck)} (a python backend stub that cannot start "
                         "hangs here; check the stub, PATH and LD_LIBRARY_PATH)")
            fix = "raise serving.ready_timeout_s if loading is just slow; " + fix
        else:
            errs = other_errors(log)
            if errs:
                lines.append("server errors:")
                lines += [f"  {_shorten(e)}" for e in errs]
            else:
                lines.append("log tail:\n    " + self.log_tail(15).replace("\n", "\n    "))
        return ServerError("\n".join(lines), fix=fix)

    def stop(self) -> int | None:
        """Graceful stop (SIGTERM, drain), then kill the process group; clean shared memory and the
        python backend's temp folder."""
        if self.proc is None:
            return None
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(self.exit_timeout + 10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # stubs left behind, or a server that would not stop
        except (ProcessLookupError, PermissionError):
            pass
        self.returncode = self.proc.wait()
        _wait_group_gone(self.proc.pid)
        _clean(self.shm_prefix, self.python_env_dirs)
        if self._record is not None:
            self._record.unlink(missing_ok=True)
        if self._log is not None and not self._log.closed:
            self._log.close()
        if self._own_workdir and self.workdir is not None and self.returncode == 0:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.returncode

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def serve_forever(self, signals: "StopSignals | None" = None) -> None:
        """Block until Ctrl-C, SIGTERM or SIGHUP (then return; the caller stops the server
        gracefully).

        Pass the :class:`StopSignals` the caller installed before :meth:`start` so that a signal
        that arrives between readiness and this call is not lost (``trtspec serve``); without it
        the handlers are installed here. A server that exits by itself meanwhile is an error, with
        the reason from its log, and so is a watchdog that gave up (a reload that failed or timed
        out, a crash loop, a server that answers no health check). Signal handlers can only be
        installed from the main thread.
        """
        with contextlib.ExitStack() as stack:
            if signals is None:
                signals = stack.enter_context(StopSignals())
            signals.serving = True
            while not signals.stop.wait(0.5):
                rc = self.proc.poll()
                if rc is not None:
                    raise self._failure(f"tritonserver exited by itself (code {rc})")
                tighten_shared_memory(self.shm_prefix)  # regions of reloaded stubs, grown regions
                if self.watchdog is not None and self.watchdog.error is not None:
                    raise self.watchdog.error


class StopRequested(BaseException):
    """SIGINT/SIGTERM/SIGHUP arrived before the server was serving (a BaseException, like
    KeyboardInterrupt, so no ``except Exception`` on the way swallows it); :meth:`TritonServer.start`
    stops what it started and re-raises it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """Handlers for SIGINT, SIGTERM and SIGHUP, installed on enter and restored on exit.

    Until :attr:`serving` is set (by the caller once the server is ready, at the latest by
    :meth:`TritonServer.serve_forever`), a signal raises :class:`StopRequested`: a stop during
    start-up cleans up instead of leaving tritonserver orphaned in its own process group. From
    then on it sets :attr:`stop`, which ``serve_forever`` waits on.
    """

    HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.serving = False
        self._old: dict = {}

    def _handle(self, signum, _frame) -> None:
        self.stop.set()
        if not self.serving:
            raise StopRequested(signum)

    def __enter__(self) -> "StopSignals":
        self._old = {s: signal.signal(s, self._handle) for s in self.HANDLED}
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def server_for_repository(
    repository: str | os.PathLike,
    *,
    host: str | None = None,
    grpc_port: int | None = None,
    http_port: int | None = None,
    metrics_port: int | None = None,
    ready_timeout: float | None = None,
    watchdog="default",
    **kwargs,
) -> TritonServer:
    """A :class:`TritonServer` for a repository; unset options come from the recipe in the
    repository's ``trtspec.json`` (``serving``), then from the defaults (free ports). The bind
    address never does: ``host``, else ``$TRTSPEC_HOST``, else 127.0.0.1 (a copied repository must
    not open the server to the network unasked; ``trtspec.triton.access``).
    The watchdog is on unless ``watchdog=None``; by default it watches the stubs only and sends no
    probe requests, which would mix into a validation's measurements (``trtspec run``);
    ``trtspec serve`` turns probes on."""

    manifest = read_repository_manifest(repository) or {}
    serving = (manifest.get("recipe") or {}).get("serving") or {}
    if watchdog == "default":
        watchdog = WatchdogSettings(probe_every_s=None)
    entries = manifest.get("entry_points") or {}
    kwargs.setdefault("entry_points", tuple(v for v in (entries.get("speculative"), entries.get("baseline")) if v))
    # serving.tritonserver_args: the recipe's passthrough, checked again here (the repository's
    # trtspec.json may have been edited since it was rendered): flags that widen exposure only with
    # serving.unsafe_passthrough (trtspec.passthrough)
    if "extra_args" not in kwargs:
        kwargs["extra_args"] = checked_passthrough(serving, f"{repository}/trtspec.json")
    # serving.tls / serving.require_header harden the server (never loosen it): taken from the
    # repository's recipe unless given; the header's value comes from the environment only
    if kwargs.get("tls") is None and serving.get("tls"):
        t = serving["tls"]
        kwargs["tls"] = TlsSettings(t["cert"], t["key"], t.get("ca"), t.get("server_ca"), t.get("server_name"))
    if kwargs.get("required_header") is None and serving.get("require_header"):
        kwargs["required_header"] = RequiredHeader.from_env(serving["require_header"])

    def pick(value, key, default):
        return value if value is not None else serving.get(key, default)

    return TritonServer(
        repository,
        host=resolve_host(host)[0],
        grpc_port=pick(grpc_port, "grpc_port", 0),
        http_port=pick(http_port, "http_port", 0),
        metrics_port=pick(metrics_port, "metrics_port", 0),
        ready_timeout=pick(ready_timeout, "ready_timeout_s", 180.0),
        watchdog=watchdog,
        **kwargs,
    )


def checked_passthrough(serving: dict, source: str) -> tuple[str, ...]:
    """``serving.tritonserver_args`` of a repository's recipe, refused (ConfigError) when one
    widens exposure without ``serving.unsafe_passthrough: true`` or is a flag trtspec sets."""
    args = serving.get("tritonserver_args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{source}: serving.tritonserver_args", repr(args), "not a list of strings")
    try:
        for w in check_tritonserver_args(args, unsafe=serving.get("unsafe_passthrough") is True):
            print(f"warning: {w}", file=sys.stderr)
    except ValueError as e:
        raise ConfigError(f"{source}: serving.tritonserver_args", " ".join(args), str(e),
                          fix="re-render the repository from a recipe that passes trtspec check") from None
    return tuple(args)


# ------------------------------------------------------------------------------------------
# what abnormal exits leave behind


def glob_python_envs() -> list[pathlib.Path]:
    """This user's python backend temp folders (another user's server may start meanwhile)."""
    return [pathlib.Path(p) for p in sorted(glob.glob(PYTHON_ENV_GLOB)) if owned_python_env(p)]


def _start_lock():
    """Serializes the moment between starting a server and seeing its python_env folder."""
    return start_lock(state_dir())


def tighten_shared_memory(shm_prefix: str) -> list[pathlib.Path]:
    """Make this server's shared-memory regions 0600; returns those that were wider.

    The python backend's regions hold every request's and response's tensors (prompts, outputs)
    and Boost.Interprocess creates them 0644 with an explicit fchmod (a umask does not help), so
    any local user could read them. The launcher narrows them after start and, in
    :meth:`TritonServer.serve_forever`, every half second (a reloaded stub or a grown pool makes new
    ones: those are readable for up to that long; docs/security.md)."""
    changed = []
    uid = os.getuid()
    for f in SHM_DIR.glob(shm_prefix + "*") if shm_prefix else []:
        try:
            fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid == uid and st.st_mode & 0o077:
                os.fchmod(fd, 0o600)
                changed.append(f)
        finally:
            os.close(fd)
    return changed


def _clean(shm_prefix: str, python_env_dirs) -> None:
    """Remove this user's shared-memory files of ``shm_prefix`` and python_env folders."""
    uid = os.getuid()
    for f in SHM_DIR.glob(shm_prefix + "*") if shm_prefix else []:
        try:
            if os.lstat(f).st_uid == uid:
                f.unlink()
        except OSError:
            pass
    for d in python_env_dirs:
        if owned_python_env(d, uid):
            shutil.rmtree(d, ignore_errors=True)


def _group_running(pgid: int) -> list[int]:
    """Processes of a group that still run (zombies excluded: orphaned stubs are reparented to
    PID 1, which in a container may never reap them)."""
    out = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(stat.parent.name))
    return out


def _wait_group_gone(pgid: int, timeout: float = 15.0) -> None:
    """After SIGKILL a big stub takes a moment to exit (seconds on a loaded machine, freeing its
    memory): stop() returns when nothing of the server runs any more, so its shared memory is
    removed after its last user."""
    deadline = time.monotonic() + timeout
    while _group_running(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _runs(pid: int, argv0: str) -> bool:
    """Whether process ``pid`` exists and runs ``argv0`` (not a recycled pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace") == argv0
    except OSError:
        return False


def sweep_leftovers() -> list[int]:
    """Clean up after recorded servers that are gone but were never stopped by their launcher
    (it was killed): their shared-memory files and python_env folder. Returns their pids.
    A server still running is left alone, even if its launcher is gone."""
    swept = []
    for rec in read_records(state_dir()):  # a bad record is skipped with a warning
        if _runs(rec.server_pid, rec.argv0):
            continue
        _clean(rec.shm_prefix, rec.python_env_dirs)
        rec.path.unlink(missing_ok=True)
        swept.append(rec.server_pid)
    return swept


def rotate_log(path: pathlib.Path, keep: int = 3) -> None:
    """``path`` → ``path.1`` → ... → ``path.<keep>`` (the oldest dropped)."""
    for i in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{i + 1}"))
    if path.exists():
        os.replace(path, path.with_name(f"{path.name}.1"))


def _shorten(s: str, n: int = 600) -> str:
    s = s.strip()
    return s if len(s) <= n else s[: n - 3] + "..."
