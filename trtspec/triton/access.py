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
The secret is on tritonserver's command line, which other *local* users can read in /proc unless
/proc is mounted with ``hidepid``: the restriction keeps out network peers, not users of the same
host (docs/security.md).

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
import re
import secrets
import ssl
from dataclasses import asdict, dataclass
from typing import Mapping

from trtspec.errors import ConfigError

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

    def args(self) -> list[str]:
        apis = ",".join(GATED_APIS)
        return [f"--http-restricted-api={apis}:{self.name}={self.value}",
                f"--grpc-restricted-protocol={apis}:{self.name}={self.value}"]

    def grpc_header(self) -> tuple[str, str]:
        return ("triton-grpc-protocol-" + self.name, self.value)

    def http_header(self) -> tuple[str, str]:
        return (self.name, self.value)


def new_secret() -> str:
    """256 random bits, URL-safe (no ``,``, ``:`` or ``=``, which Triton's flag syntax uses)."""
    return secrets.token_urlsafe(32)


def restricted_args(secret: str) -> list[str]:
    """tritonserver flags that close :data:`RESTRICTED_APIS` behind ``HEADER: secret``."""
    apis = ",".join(RESTRICTED_APIS)
    return [f"--http-restricted-api={apis}:{HEADER}={secret}",
            f"--grpc-restricted-protocol={apis}:{HEADER}={secret}"]


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
