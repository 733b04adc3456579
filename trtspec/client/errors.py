"""Client errors: every failure of a request becomes one of these, naming the model, the gRPC
status and the server's own message (trimmed of the python-backend traceback).

Exit code 4 (not 1) so a pipeline can tell "the server could not be used" from
"validation ran and the gate said keep the baseline" (exit 1). Three failures a user fixes on
their side get codes of their own (``EXIT_CODES``): TLS (5), authentication (6) and an
OpenAI-compatible server that returns no token ids where they were required (7).
"""

from __future__ import annotations

import re

from trtspec.errors import ClientError


class ServerRequestError(ClientError):
    """Base of the client's errors: ``url``, ``model``, ``status`` (gRPC code name) and the
    server's ``server_message`` (full text, traceback included, for logs). ``partial`` is the
    output that arrived before the failure (a :class:`GenerationResult`), or None."""

    exit_code = 4
    partial = None

    def __init__(self, message: str, *, url: str | None = None, model: str | None = None,
                 status: str | None = None, server_message: str | None = None, fix: str | None = None):
        self.url, self.model, self.status, self.server_message = url, model, status, server_message
        where = []
        if model:
            where.append(f"model '{model}'")
        if url:
            where.append(f"at {url}")
        head = f"{' '.join(where)}: " if where else ""
        tail = f" [{status}]" if status else ""
        super().__init__(f"{head}{message}{tail}", fix=fix)


class ServerUnavailable(ServerRequestError):
    """Nothing answers at the URL, or the connection dropped (server crashed or stopping)."""


class ServerBusy(ServerUnavailable):
    """The server is up but turned the request away unserved (queue full, queue timeout): nothing
    was generated, so it is safe to send again later."""


class TLSMismatch(ServerRequestError):
    """The TLS handshake failed: plaintext against a TLS server or the reverse, an unknown CA, a
    missing or refused client certificate."""

    exit_code = 5


class AuthRejected(ServerRequestError):
    """The server or a gateway in front of it refused the credentials (HTTP 401/403, gRPC
    UNAUTHENTICATED/PERMISSION_DENIED, Triton's restricted protocols)."""

    exit_code = 6


class NoTokenIds(ServerRequestError):
    """An OpenAI-compatible server answered without token ids, and they were required."""

    exit_code = 7


# documented in `trtspec bench --help` / `trtspec validate --help`
EXIT_CODES = {
    0: "deploy speculative (validate) / finished (bench)",
    1: "keep the baseline: a gate failed (validate)",
    2: "bad input: options, recipe, --url scheme, --header, TLS files",
    3: "internal error (re-run with --debug)",
    4: "the server could not be used: unreachable, not ready, failing requests, went away mid-run",
    5: "TLS mismatch: plaintext vs TLS, unknown CA, client certificate refused",
    6: "authentication refused: HTTP 401/403, gRPC UNAUTHENTICATED/PERMISSION_DENIED",
    7: "the OpenAI-compatible server returned no token ids (--require-token-ids)",
}


class ServerNotReady(ServerRequestError):
    """The server answers but is not ready (still loading models) within the wait."""


class ModelNotFound(ServerRequestError):
    """The server has no model of that name (or it is not loaded)."""


class RequestRejected(ServerRequestError):
    """The server refused the request as malformed (unknown input, wrong shape or type)."""


class InferenceFailed(ServerRequestError):
    """The model accepted the request and failed while serving it."""


class RequestTimeout(ServerRequestError):
    """The request did not finish within the client's timeout."""


_STATUS = re.compile(r"StatusCode\.([A-Z_]+)")


def status_name(code: object) -> str | None:
    """'StatusCode.NOT_FOUND' / grpc.StatusCode.NOT_FOUND / None → 'NOT_FOUND' / None."""
    if code is None:
        return None
    name = getattr(code, "name", None)
    if isinstance(name, str):
        return name
    m = _STATUS.search(str(code))
    return m.group(1) if m else str(code)


def short_message(message: str) -> str:
    """The server's message without the python-backend traceback (``\\n\\nAt:\\n ...``)."""
    return message.split("\n\nAt:", 1)[0].strip()


def classify(status: str | None, message: str, *, url: str | None, model: str | None) -> ServerRequestError:
    """Map a gRPC status (None for errors delivered inside a stream) and message to an error class.

    Stream responses carry only a message, so the message patterns of tritonserver 2.51
    (reference/triton-cpu.md §8) decide when the status is missing."""
    msg = short_message(message)
    low = msg.lower()
    kw = dict(url=url, model=model, status=status, server_message=message)
    if "hostname verification" in low:
        return TLSMismatch(f"the server's certificate does not name the host in the URL: {msg}", **kw,
                           fix="connect by a name the certificate has, or check it under another name "
                               "(--tls-server-name NAME; TLSOptions.server_name)")
    if "ssl" in low or "handshake" in low or "certificate" in low or "tls" in low.split() \
            or "verification check failed" in low:
        return TLSMismatch(f"TLS handshake failed: {msg}", **kw,
                           fix="match the server: grpcs:// / https:// for a TLS server (plain grpc:// / http:// "
                               "otherwise); --tls-ca for a private CA; --tls-cert/--tls-key if it asks for a "
                               "client certificate")
    if status in ("UNAUTHENTICATED", "PERMISSION_DENIED") or "protocol is restricted" in low \
            or "expecting header" in low:
        want = re.search(r"expecting header '([^']+)'", msg)
        return AuthRejected(f"the server refused the credentials: {msg}", **kw,
                            fix=f"pass the header it expects: --header '{want.group(1) if want else 'NAME'}: VALUE'")
    if status in ("UNAVAILABLE",) and ("failed to connect" in low or "connection refused" in low
                                        or "dns resolution failed" in low or "name resolution" in low):
        return ServerUnavailable(
            f"no Triton server is reachable: {msg}", **kw,
            fix="start one (trtspec serve REPO) or pass the right --url HOST:PORT (the gRPC port, 8001 by default)",
        )
    if "stream removed" in low or "socket closed" in low or "server exiting" in low:
        return ServerUnavailable(f"the connection to the server was lost: {msg}", **kw,
                                 fix="check the server log: it crashed or is shutting down")
    if status == "NOT_FOUND" or "unknown model" in low or "has no available versions" in low:
        return ModelNotFound(f"the server has no such model: {msg}", **kw,
                             fix="check the model name against the repository (trtspec serves 'ensemble' and "
                                 "'ensemble_baseline'); `curl HOST:HTTP_PORT/v2/repository/index` lists them")
    if "queue full" in low or "exceeds maximum queue size" in low or "request timeout expired" in low:
        return ServerBusy(f"the server is busy and did not take the request: {msg}", **kw,
                          fix="lower the concurrency or the request rate, or raise serving.max_queue_size")
    if status == "DEADLINE_EXCEEDED" or "deadline exceeded" in low:
        return RequestTimeout(f"request timed out: {msg}", **kw, fix="raise the client timeout or lower max_tokens")
    if status in ("INVALID_ARGUMENT", "UNIMPLEMENTED") or "unexpected inference input" in low \
            or "unexpected shape" in low or "not found in the model configuration" in low \
            or "unexpected datatype" in low or "data-type is" in low or re.search(r"expected \d+ inputs but got \d+", low) \
            or low.startswith("preprocessing: ") or ", preprocessing: " in low \
            or "invalid sampling parameters" in low:
        # stream errors carry no status: Triton's own checks and trtspec's preprocessing (which
        # checks every request against the deployment's limits) are known by their wording
        return RequestRejected(f"the server rejected the request: {msg}", **kw,
                               fix="fix the request as the server's message says; the inputs the ensemble "
                                   "takes are in docs/serving.md (the trtspec/NVIDIA contract)")
    if status == "UNAVAILABLE":
        return ServerUnavailable(f"the server is unavailable: {msg}", **kw,
                                 fix="it may be overloaded (queue full) or stopping; retry later or lower concurrency")
    return InferenceFailed(f"the model failed to serve the request: {msg}", **kw,
                           fix="see the tritonserver log for the model's traceback")


def from_exception(exc: BaseException, *, url: str | None, model: str | None) -> ServerRequestError:
    """From a tritonclient ``InferenceServerException`` or a raw ``grpc.RpcError``."""
    if isinstance(exc, ServerRequestError):
        return exc
    status = None
    if hasattr(exc, "status") and callable(exc.status):  # InferenceServerException
        status = status_name(exc.status())
        message = exc.message() if callable(getattr(exc, "message", None)) else str(exc)
    elif hasattr(exc, "code") and callable(exc.code):  # grpc.RpcError / AioRpcError
        status = status_name(exc.code())
        message = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    else:
        message = str(exc)
    return classify(status, message or type(exc).__name__, url=url, model=model)
