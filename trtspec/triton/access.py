"""Who may do what on a server trtspec launches: the per-launch secret and the bind address.

Triton's HTTP and gRPC endpoints serve, besides inference, APIs that change the server: the model
repository (load a model with a config or *files* override: a python ``model.py`` of the caller's,
run as the server's user; unload the ensemble), shared-memory registration, tracing and logging
settings. trtspec's watchdog needs the repository API (explicit model control), so it cannot be
switched off; instead every launch closes these APIs behind a header that carries a secret made
for that launch (:func:`new_secret`), known to the launcher, its watchdog and, through the
environment, the server's python stubs (router, postprocessing, engines):

* ``--http-restricted-api`` / ``--grpc-restricted-protocol`` for :data:`RESTRICTED_APIS` with the
  header :data:`HEADER` (HTTP) / ``triton-grpc-protocol-`` + :data:`HEADER` (gRPC; Triton adds the
  prefix);
* ``stop`` requests to an engine model are honoured only with a request id signed by the secret
  (:func:`signed_stop_id`); the ``trtspec_watchdog`` counters only with the secret
  (:data:`SECRET_INPUT`).

What stays open: inference, health, metadata, model config and statistics (a client needs them).
Triton 2.51 reads the keys only from its arguments, which other *local* users can read in
/proc/<pid>/cmdline: the launcher writes them as placeholders (:func:`hidden`) that the argv shim
(``argv_secrets.c``, preloaded; :func:`argv_shim`) fills from the environment before tritonserver's
``main`` parses them, so neither the secret nor the required header's value is on a command line.
Without a C compiler the launcher falls back to the values themselves, with a warning
(docs/security.md).

The bind address comes from ``--host`` or ``$TRTSPEC_HOST`` only, never from a repository's
``trtspec.json`` (a copied repository must not open the server to the network unasked); a
non-loopback address gets a warning naming what it exposes (:func:`exposure_warning`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import pathlib
import re
import secrets
import shutil
import ssl
import stat
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from typing import Mapping

from trtspec.errors import ConfigError, ServerError

RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")
HEADER = "trtspec-admin-key"
GRPC_HEADER = "triton-grpc-protocol-" + HEADER  # what a gRPC client sends (Triton's prefix + HEADER)
SECRET_ENV = "TRTSPEC_LAUNCH_SECRET"  # the secret, in the server's (and so the stubs') environment
HOST_ENV = "TRTSPEC_HOST"
SECRET_INPUT = "SECRET"  # the trtspec_watchdog model's input that carries the secret
_STOP_SEP = "|"


@dataclass(frozen=True)
class TlsSettings:
    """Triton's gRPC over TLS (``serving.tls``; ``serve --tls-*``), PEM files:

    * ``cert`` / ``key``: the server's certificate (chain) and key;
    * ``ca``: mutual TLS: clients must present a certificate this CA signed;
    * ``server_ca``: what trtspec's own clients of the server (the router's relay, the watchdog,
      the OpenAI relay) verify its certificate with; default ``ca``, else ``cert`` itself (a
      self-signed certificate); under mutual TLS they present ``cert``/``key``;
    * ``server_name``: the name they check in the certificate when they connect over loopback;
      default its first DNS name (else ``localhost``).

    Triton 2.51 has TLS on gRPC only, so the launcher binds the plaintext HTTP port to 127.0.0.1
    under TLS (the metrics port stays on the host: Prometheus scrapes it; docs/security.md)."""

    cert: str
    key: str
    ca: str | None = None
    server_ca: str | None = None
    server_name: str | None = None

    def check(self) -> None:
        for flag, path in (("--tls-cert", self.cert), ("--tls-key", self.key), ("--tls-ca", self.ca),
                           ("--tls-server-ca", self.server_ca)):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(flag, path, "file not found", fix="pass a PEM file")

    def args(self) -> list[str]:
        out = [f"--grpc-server-cert={os.path.abspath(self.cert)}", f"--grpc-server-key={os.path.abspath(self.key)}"]
        if self.ca:
            return ["--grpc-use-ssl-mutual=true", *out, f"--grpc-root-cert={os.path.abspath(self.ca)}"]
        return ["--grpc-use-ssl=true", *out]

    def internal(self) -> "InternalTls":
        """How the server's own clients connect to it."""
        return InternalTls(root=os.path.abspath(self.server_ca or self.ca or self.cert),
                           cert=os.path.abspath(self.cert) if self.ca else None,
                           key=os.path.abspath(self.key) if self.ca else None,
                           server_name=self.server_name or certificate_name(self.cert))


def certificate_name(cert: str) -> str:
    """The first DNS name of a PEM certificate (subjectAltName, else its CN), else ``localhost``."""
    try:
        decoded = ssl._ssl._test_decode_cert(cert)  # noqa: SLF001 - the stdlib's only PEM reader
    except (AttributeError, OSError, ssl.SSLError, ValueError):
        return "localhost"
    for kind, value in decoded.get("subjectAltName", ()):
        if kind == "DNS":
            return value
    for rdn in decoded.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return "localhost"


@dataclass(frozen=True)
class InternalTls:
    """TLS of a client inside the deployment (the router's relay, the watchdog): files, and the
    name to check in the server's certificate (it connects to a loopback address)."""

    root: str
    cert: str | None = None
    key: str | None = None
    server_name: str = "localhost"


@dataclass(frozen=True)
class InternalClient:
    """What a client inside the deployment needs to call the server's own gRPC port: its TLS, and
    the headers a required-header server asks of every inference/metadata call. The launcher puts
    it into the server's environment (:data:`INTERNAL_ENV`) for the stubs; the watchdog gets it
    directly."""

    tls: InternalTls | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def to_env(self) -> str:
        return json.dumps({"tls": None if self.tls is None else asdict(self.tls), "headers": list(self.headers)})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "InternalClient":
        raw = (os.environ if environ is None else environ).get(INTERNAL_ENV)
        if not raw:
            return cls()
        d = json.loads(raw)
        return cls(tls=InternalTls(**d["tls"]) if d.get("tls") else None,
                   headers=tuple((k, v) for k, v in d.get("headers", ())))

    def grpc_kwargs(self) -> dict:
        """Keyword arguments of tritonclient's (sync or aio) ``InferenceServerClient``."""
        if self.tls is None:
            return {}
        def read(path):
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()
        # channel_args replaces tritonclient's own options: keep its unlimited message sizes
        args = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1),
                ("grpc.ssl_target_name_override", self.tls.server_name)]
        return {"ssl": True, "root_certificates": self.tls.root, "private_key": self.tls.key,
                "certificate_chain": self.tls.cert, "channel_args": args}

    def grpc_headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**dict(self.headers), **(extra or {})}


INTERNAL_ENV = "TRTSPEC_INTERNAL_CLIENT"


# ------------------------------------------------------------------------------------------
# the required-header mode (a gateway in front)

REQUIRED_HEADER_ENV = "TRTSPEC_REQUIRED_HEADER_VALUE"
# what a required header guards; health stays open (load balancers and kubelets probe it) and the
# admin APIs keep the launch's secret (Triton allows one restriction per API)
GATED_APIS = ("inference", "metadata", "model-config", "statistics")
_HEADER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


@dataclass(frozen=True)
class RequiredHeader:
    """``serve --require-header NAME`` (``serving.require_header``): every inference, metadata,
    model-config and statistics call needs ``NAME: value``; the value comes from the environment
    (:data:`REQUIRED_HEADER_ENV`), never from a file or the command line of trtspec. A gateway
    in front adds it; over gRPC Triton expects it as ``triton-grpc-protocol-NAME``."""

    name: str
    value: str

    @classmethod
    def from_env(cls, name: str, environ: Mapping[str, str] | None = None) -> "RequiredHeader":
        name = name.strip().lower()
        if not _HEADER_NAME.match(name) or name == HEADER:
            raise ConfigError("serving.require_header", name, "not a usable header name",
                              fix="lower-case letters, digits and '-' (e.g. x-gateway-key), not " + HEADER)
        value = (os.environ if environ is None else environ).get(REQUIRED_HEADER_ENV, "")
        if len(value) < 16 or any(c in value for c in ",:= \t\n"):
            raise ConfigError(REQUIRED_HEADER_ENV, "(unset)" if not value else "(hidden)",
                              "the required header's value must be set, at least 16 characters, without , : = or spaces",
                              fix=f"export {REQUIRED_HEADER_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        return cls(name, value)

    def args(self, *, hide: bool = False) -> list[str]:
        """The flags; with ``hide``, placeholders the argv shim fills from :data:`REQUIRED_HEADER_ENV`."""
        apis = ",".join(GATED_APIS)
        if hide:
            return hidden(restricted_rules(GATED_APIS, self.name, "{" + REQUIRED_HEADER_ENV + "}"))
        return [f"--http-restricted-api={apis}:{self.name}={self.value}",
                f"--grpc-restricted-protocol={apis}:{self.name}={self.value}"]

    def grpc_header(self) -> tuple[str, str]:
        return ("triton-grpc-protocol-" + self.name, self.value)

    def http_header(self) -> tuple[str, str]:
        return (self.name, self.value)


def new_secret() -> str:
    """256 random bits, URL-safe (no ``,``, ``:`` or ``=``, which Triton's flag syntax uses)."""
    return secrets.token_urlsafe(32)


def restricted_rules(apis: tuple[str, ...], header: str, value: str) -> list[str]:
    return [f"--http-restricted-api={','.join(apis)}:{header}={value}",
            f"--grpc-restricted-protocol={','.join(apis)}:{header}={value}"]


def restricted_args(secret: str) -> list[str]:
    """tritonserver flags that close :data:`RESTRICTED_APIS` behind ``HEADER: secret``."""
    return restricted_rules(RESTRICTED_APIS, HEADER, secret)


def hidden_restricted_args(env: str = SECRET_ENV) -> list[str]:
    """:func:`restricted_args` as placeholders: the argv shim fills in ``$env`` (the launch secret)."""
    return hidden(restricted_rules(RESTRICTED_APIS, HEADER, "{" + env + "}"))


# ------------------------------------------------------------------------------------------
# the argv shim: secrets off the command line

ARGV_MARK = "@trtspec@"  # after a flag's "=": the argv shim fills this argument in (argv_secrets.c)
ARGV_SHIM_ENV = "TRTSPEC_ARGV_SHIM"  # a prebuilt shim (the serving image sets it)
ARGV_SHIM_NAME = "libtrtspec_argv.so"
IMAGE_ARGV_SHIM = "/usr/local/lib/trtspec/" + ARGV_SHIM_NAME  # where docker/Dockerfile installs it
_PLACEHOLDER = re.compile(r"\{([A-Z][A-Z0-9_]*)\}")


def hidden(flags: list[str]) -> list[str]:
    """``--flag=VALUE{NAME}`` → ``--flag=@trtspec@VALUE{NAME}``: the argv shim drops the mark and
    puts ``$NAME`` in place of ``{NAME}`` in the argv that tritonserver's main() parses;
    /proc/<pid>/cmdline keeps the placeholder. Unfilled (no shim), the argument is not a valid
    rule and tritonserver refuses to start (fail-closed)."""
    out = []
    for f in flags:
        flag, _, value = f.partition("=")
        out.append(f"{flag}={ARGV_MARK}{value}")
    return out


def placeholder_env(argv) -> list[str]:
    """The environment variables the placeholders of ``argv`` read (in order, once each)."""
    names: list[str] = []
    for a in argv:
        if ARGV_MARK in a:
            names += [n for n in _PLACEHOLDER.findall(a) if n not in names]
    return names


def fill_placeholders(argv, environ: Mapping[str, str]) -> list[str]:
    """What the argv shim makes of ``argv`` (a test's and a reader's reference)."""
    out = []
    for a in argv:
        if "=" + ARGV_MARK in a:
            a = a.replace("=" + ARGV_MARK, "=", 1)
            a = _PLACEHOLDER.sub(lambda m: environ[m.group(1)], a)
        out.append(a)
    return out


def _shim_source() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parent / "launch" / "argv_secrets.c"


def shim_cache_dir() -> pathlib.Path:
    """``$XDG_CACHE_HOME/trtspec/argv`` (``~/.cache/trtspec/argv``), where the shim is built once."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "trtspec" / "argv"


def argv_shim(environ: Mapping[str, str] | None = None) -> tuple[pathlib.Path | None, str | None]:
    """(the argv shim's path, None), or (None, why not: a warning). ``$TRTSPEC_ARGV_SHIM`` (the
    serving image's prebuilt one) first; else built with ``gcc`` once per source into
    :func:`shim_cache_dir` (a private folder of this user: it is code tritonserver runs)."""
    env = os.environ if environ is None else environ
    given = env.get(ARGV_SHIM_ENV)
    if given:
        if os.path.isfile(given):
            return pathlib.Path(given), None
        return None, f"${ARGV_SHIM_ENV} names {given}, which is not a file"
    src = _shim_source()
    try:
        code = src.read_bytes()
    except OSError as e:
        return None, f"the argv shim's source {src} cannot be read ({e.strerror})"
    folder = shim_cache_dir() / hashlib.sha256(code).hexdigest()[:16]
    lib = folder / ARGV_SHIM_NAME
    if _private_file(lib):
        return lib, None
    cc = shutil.which(env.get("CC") or "gcc") or shutil.which("cc")
    if cc is None:
        return None, "no C compiler (gcc) to build the argv shim"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(folder, 0o700)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            out = pathlib.Path(tmp) / ARGV_SHIM_NAME
            r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out), str(src)],
                               capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                return None, f"building the argv shim failed: {(r.stderr or r.stdout).strip()[:300]}"
            os.chmod(out, 0o700)
            os.replace(out, lib)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"building the argv shim failed: {e}"
    return (lib, None) if _private_file(lib) else (None, f"{lib} is not a private file of yours")


def _private_file(p: pathlib.Path) -> bool:
    """A regular file (not a link) of this user that nobody else may write, in such a folder."""
    try:
        for q, want in ((p.parent, stat.S_ISDIR), (p, stat.S_ISREG)):
            st = os.lstat(q)
            if not want(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
                return False
    except OSError:
        return False
    return True


SHIM_FALLBACK_WARNING = ("the admin secret and the required header's value are on tritonserver's command line, "
                         "readable by every local user in /proc/<pid>/cmdline ({why}); install gcc (or set "
                         f"${ARGV_SHIM_ENV} to a built {ARGV_SHIM_NAME}) to keep them off it (docs/security.md)")


def http_headers(secret: str | None) -> dict[str, str]:
    return {HEADER: secret} if secret else {}


def grpc_headers(secret: str | None) -> dict[str, str]:
    return {GRPC_HEADER: secret} if secret else {}


def secret_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    return (os.environ if environ is None else environ).get(SECRET_ENV) or None


# ------------------------------------------------------------------------------------------
# stop requests


def _tag(secret: str, request_id: str) -> str:
    return hmac.new(secret.encode(), b"stop:" + request_id.encode(), hashlib.sha256).hexdigest()[:32]


def signed_stop_id(request_id: str, secret: str) -> str:
    """The id a ``stop`` request for ``request_id`` carries: the id and its HMAC under the secret."""
    return f"{request_id}{_STOP_SEP}{_tag(secret, request_id)}"


def verify_stop_id(stop_id: str, secret: str | None) -> str | None:
    """The request id a ``stop`` request may stop, or None: no secret here, or not signed by it."""
    if not secret or not stop_id:
        return None
    rid, sep, tag = stop_id.rpartition(_STOP_SEP)
    if not sep or not rid or not hmac.compare_digest(tag, _tag(secret, rid)):
        return None
    return rid


# ------------------------------------------------------------------------------------------
# the bind address


def resolve_host(cli_host: str | None, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(address, where it came from): ``--host``, else ``$TRTSPEC_HOST``, else 127.0.0.1."""
    env = os.environ if environ is None else environ
    if cli_host:
        return cli_host, "--host"
    if env.get(HOST_ENV):
        return env[HOST_ENV], f"${HOST_ENV}"
    return "127.0.0.1", "default"


def is_loopback(host: str) -> bool:
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False  # a host name: assume it resolves to something reachable


def exposure_warning(host: str, grpc_port: int, http_port: int, metrics_port: int, *,
                     tls: bool = False, required_header: RequiredHeader | None = None) -> str | None:
    """None on loopback; else what anyone who reaches ``host`` can use."""
    if is_loopback(host):
        return None
    ports = f"gRPC :{grpc_port}" + ("" if tls else f", HTTP :{http_port}")
    if required_header is None:
        who = (f"anyone who reaches this address can send generation requests, unauthenticated ({ports}: "
               "inference, health, metadata, model config, statistics)")
    else:
        who = (f"callers that send the {required_header.name} header can send generation requests ({ports}); "
               "anyone can call health")
    return (f"binding {host}: {who}, and read the metrics (:{metrics_port}: model names, request counts, "
            f"latencies). The model-repository, shared-memory, trace and logging APIs need this launch's secret. "
            + (f"gRPC uses TLS; HTTP (:{http_port}) stays on 127.0.0.1; the metrics have no TLS; " if tls
               else "There is no TLS; ")
            + ("the header is a shared secret, not per-client authentication" if required_header is not None
               else "there is no client authentication")
            + ": put the server behind a gateway or a mesh (docs/security.md)")


# ------------------------------------------------------------------------------------------
# the per-user state folder (trtspec.triton.launch.state: the launcher's records and start lock;
# trtspec.triton.backend.worker: the engine-load lock)


def state_dir(environ: Mapping[str, str] | None = None, tmp: str | None = None) -> pathlib.Path:
    """This user's private state folder (created 0700); ServerError when it is not safe to use."""
    env = os.environ if environ is None else environ
    uid = os.getuid()
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and _private_dir(pathlib.Path(runtime), uid):
        d = pathlib.Path(runtime) / "trtspec"
    else:
        d = pathlib.Path(tmp or tempfile.gettempdir()) / f"trtspec-{uid}"
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise ServerError(f"cannot create trtspec's state folder {d}: {e}") from None
    why = _unsafe(d, uid)
    if why:
        raise ServerError(f"trtspec's state folder {d} {why}; refusing to use it (its records decide what "
                          "trtspec deletes)",
                          fix="remove it if you did not make it (another user may have), or set XDG_RUNTIME_DIR "
                              "to a private folder of yours")
    return d


def _private_dir(p: pathlib.Path, uid: int) -> bool:
    return _unsafe(p, uid) is None


def _unsafe(p: pathlib.Path, uid: int) -> str | None:
    try:
        st = os.lstat(p)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != uid:
        return f"belongs to uid {st.st_uid}, not to you (uid {uid})"
    if st.st_mode & 0o077:
        return f"is open to other users (mode {stat.S_IMODE(st.st_mode):o}, want 700)"
    return None
