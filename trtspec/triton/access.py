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
import os
import secrets
from dataclasses import dataclass
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
    """Triton's gRPC over TLS: the server's certificate and key (PEM files); with ``ca``, clients
    must present a certificate that CA signed (mutual TLS). Triton 2.51 has TLS on gRPC only: the
    HTTP port (watchdog, health, /generate) stays plaintext, so keep it on loopback or inside the
    mesh (docs/security.md)."""

    cert: str
    key: str
    ca: str | None = None

    def check(self) -> None:
        for flag, path in (("--tls-cert", self.cert), ("--tls-key", self.key), ("--tls-ca", self.ca)):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(flag, path, "file not found", fix="pass a PEM file")

    def args(self) -> list[str]:
        out = [f"--grpc-server-cert={os.path.abspath(self.cert)}", f"--grpc-server-key={os.path.abspath(self.key)}"]
        if self.ca:
            return ["--grpc-use-ssl-mutual=true", *out, f"--grpc-root-cert={os.path.abspath(self.ca)}"]
        return ["--grpc-use-ssl=true", *out]


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
                     tls: bool = False) -> str | None:
    """None on loopback; else what anyone who reaches ``host`` can use."""
    if is_loopback(host):
        return None
    return (f"binding {host}: anyone who reaches this address can send generation requests, unauthenticated "
            f"(gRPC :{grpc_port}, HTTP :{http_port}: inference, health, metadata, model config, statistics), "
            f"and read the metrics (:{metrics_port}: model names, request counts, latencies). "
            f"The model-repository, shared-memory, trace and logging APIs need this launch's secret. "
            + ("gRPC uses TLS, HTTP and metrics do not; " if tls else "There is no TLS; ")
            + "there is no client authentication: put the server behind a gateway or a mesh (docs/security.md)")
