"""Where a client connects: the ``--url`` schemes, TLS files and headers.

=============================  ==============================================================
``HOST:PORT``, ``grpc://``     Triton gRPC, plaintext (:class:`~trtspec.client.client.AsyncLLMClient`)
``grpcs://HOST:PORT``          Triton gRPC over TLS (``--tls-ca``, and ``--tls-cert``/``--tls-key``
                               for mutual TLS)
``http(s)://HOST:PORT/v1``     any OpenAI-compatible server: trtllm-serve, vLLM, Triton's OpenAI
                               frontend, ``trtspec serve --openai-port``
                               (:class:`~trtspec.client.openai_http.AsyncOpenAIClient`), with
                               ``endpoint`` ``completions`` or ``chat``
=============================  ==============================================================

``headers`` go out with every call: gRPC metadata, or HTTP headers (e.g. an auth gateway's
``Authorization: Bearer ...``). :func:`open_client` picks the client for a URL.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
from dataclasses import dataclass
from typing import Any

from trtspec.errors import ConfigError

SCHEMES = ("grpc", "grpcs", "http", "https")
ENDPOINTS = ("completions", "chat")
_URL = re.compile(r"^(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://)?(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-_]+)"
                  r"(?::(?P<port>\d{1,5}))?(?P<path>/[^?#]*)?$")
# a header name as HTTP and gRPC metadata allow it (gRPC keys are lower-cased on the wire)
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


@dataclass(frozen=True)
class Target:
    """A parsed ``--url``."""

    scheme: str  # grpc | grpcs | http | https
    host: str
    port: int
    path: str = ""  # OpenAI: the API root, "/v1" by default

    @property
    def kind(self) -> str:
        return "grpc" if self.scheme in ("grpc", "grpcs") else "openai"

    @property
    def tls(self) -> bool:
        return self.scheme in ("grpcs", "https")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """How results name the server: plaintext gRPC as before (``HOST:PORT``), the rest with
        their scheme."""
        if self.scheme == "grpc":
            return self.address
        return f"{self.scheme}://{self.address}{self.path}"


def parse_target(url: str) -> Target:
    """A :class:`Target`, or a :class:`ConfigError` naming what is wrong and the forms accepted."""
    forms = "grpc://HOST:PORT (Triton), grpcs://HOST:PORT (Triton over TLS) or http(s)://HOST:PORT/v1 (OpenAI-compatible)"
    m = _URL.match(url.strip()) if isinstance(url, str) else None
    if not m:
        raise ConfigError("--url", url, "not a server address", fix=f"use {forms}")
    scheme = (m.group("scheme") or "grpc").lower()
    if scheme not in SCHEMES:
        raise ConfigError("--url", url, f"unknown scheme '{scheme}://'", fix=f"use {forms}")
    port = m.group("port")
    if port is None:
        if scheme in ("grpc", "grpcs"):
            raise ConfigError("--url", url, "a gRPC URL needs a port: HOST:PORT",
                              fix="e.g. --url 127.0.0.1:8001 (an OpenAI-compatible server: http://HOST:PORT/v1)")
        port = "443" if scheme == "https" else "80"
    if not 0 < int(port) < 65536:
        raise ConfigError("--url", url, f"port {port} is out of range", fix="a port is 1-65535")
    path = (m.group("path") or "").rstrip("/")
    if scheme in ("grpc", "grpcs") and path:
        raise ConfigError("--url", url, "a gRPC URL has no path", fix="e.g. --url grpc://127.0.0.1:8001")
    if scheme in ("http", "https") and not path:
        path = "/v1"
    return Target(scheme=scheme, host=m.group("host"), port=int(port), path=path)


@dataclass(frozen=True)
class TLSOptions:
    """PEM files: ``ca`` verifies the server (default: the system's roots); ``cert`` + ``key``
    identify the client (mutual TLS). ``server_name``: the name to check in the server's
    certificate instead of the URL's host (gRPC; e.g. connecting by IP to a certificate for a
    DNS name)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    def __post_init__(self):
        for name, path in (("--tls-ca", self.ca), ("--tls-cert", self.cert), ("--tls-key", self.key)):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(name, path, "file not found", fix="pass a PEM file")
        if (self.cert is None) != (self.key is None):
            raise ConfigError("--tls-cert" if self.cert is None else "--tls-key", None,
                              "mutual TLS needs both the client certificate and its key",
                              fix="pass --tls-cert CERT.pem and --tls-key KEY.pem together")

    @property
    def any(self) -> bool:
        return any((self.ca, self.cert, self.key, self.server_name))

    def channel_args(self) -> list[tuple[str, Any]] | None:
        """gRPC channel options (tritonclient's own message limits kept: channel_args replaces them)."""
        if self.server_name is None:
            return None
        return [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1),
                ("grpc.ssl_target_name_override", self.server_name)]

    def read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        def rd(p):
            if p is None:
                return None
            with open(p, "rb") as f:
                return f.read()

        return rd(self.ca), rd(self.cert), rd(self.key)


@dataclass(frozen=True)
class ClientOptions:
    """What ``--tls-*``, ``--header`` and ``--endpoint`` set, for any target."""

    tls: TLSOptions = TLSOptions()
    headers: tuple[tuple[str, str], ...] = ()
    endpoint: str = "completions"  # OpenAI targets: /v1/completions or /v1/chat/completions
    # OpenAI targets: a response without token ids is an error (exit 7) instead of a text comparison
    require_token_ids: bool = False

    def __post_init__(self):
        if self.endpoint not in ENDPOINTS:
            raise ConfigError("--endpoint", self.endpoint, "unknown endpoint", fix="use completions or chat")

    def check(self, target: Target) -> None:
        """Options that make no sense for this target are errors, not silently ignored."""
        if self.tls.any and not target.tls:
            raise ConfigError("--url", target.url, "--tls-* options given for a plaintext URL",
                              fix=f"use {'grpcs' if target.kind == 'grpc' else 'https'}://{target.address}"
                                  f"{target.path} to connect over TLS")
        if self.tls.server_name is not None and target.kind != "grpc":
            raise ConfigError("--tls-server-name", self.tls.server_name, "only gRPC targets take a server name",
                              fix="connect to https://NAME:PORT/v1 by the name the certificate has")
        if self.endpoint != "completions" and target.kind == "grpc":
            raise ConfigError("--endpoint", self.endpoint, "only OpenAI-compatible targets have endpoints",
                              fix="drop --endpoint, or use --url http://HOST:PORT/v1")

    @property
    def header_dict(self) -> dict[str, str]:
        return dict(self.headers)


def parse_headers(values) -> tuple[tuple[str, str], ...]:
    """``["K:V", ...]`` (``--header``, repeated) → ``(("K", "V"), ...)``."""
    out = []
    for v in values or ():
        name, sep, value = str(v).partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or not _HEADER_NAME.match(name):
            raise ConfigError("--header", v, "expected NAME:VALUE", fix="e.g. --header 'Authorization: Bearer TOKEN'")
        out.append((name, value))
    return tuple(out)


async def speaks_tls(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Does the server at host:port complete a TLS handshake (certificate not checked)? Tells a
    plaintext client that its connection was dropped because the server expects TLS."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        async with asyncio.timeout(timeout_s):
            _, w = await asyncio.open_connection(host.strip("[]"), port, ssl=ctx)
        w.close()
        return True
    except Exception:  # noqa: BLE001 - any failure: not a TLS server
        return False
