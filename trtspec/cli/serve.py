"""`trtspec serve`: run tritonserver on a rendered repository, with the watchdog."""

from __future__ import annotations

import contextlib
import json
import sys

import click

from trtspec.openai_api import exposure_warning as openai_exposure_warning
from trtspec.openai_api import relay_for_repository
from trtspec.triton.access import RequiredHeader, TlsSettings, exposure_warning
from trtspec.triton.launch.mpi import planned_launch, with_repository_layout
from trtspec.triton.launch.server import StopRequested, StopSignals, server_for_repository
from trtspec.triton.launch.watchdog import WatchdogSettings
from trtspec.triton.render import read_repository_manifest
from trtspec.errors import require_extra
from trtspec.cli.common import err, handle_errors, out


@click.command()
@click.argument("repo", type=click.Path(exists=True, file_okay=False))
@click.option("--host", default=None,
              help="Address to bind (default: $TRTSPEC_HOST, else 127.0.0.1; never the repository's trtspec.json). "
                   "A non-loopback address exposes inference to anyone who reaches it: docs/security.md.")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=None, help="0 = a free port (default).")
@click.option("--http-port", type=click.IntRange(0, 65535), default=None, help="0 = a free port (default).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, help="0 = a free port (default).")
@click.option("--ready-timeout", type=click.FloatRange(min=1), default=None,
              help="Seconds to wait for every model to load (default: serving.ready_timeout_s, 180).")
@click.option("--json", "as_json", is_flag=True, help="Print the endpoints as one JSON line when ready.")
@click.option("--dry-run", is_flag=True,
              help="Print the launch plan (TRT-LLM engines: mpirun over every rank) and exit; starts nothing.")
@click.option("--no-watchdog", is_flag=True,
              help="Do not watch the models (no reload of a model whose python stub died; docs/reliability.md).")
@click.option("--probe-every", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds between the watchdog's one-token probes of the entry points; 0 = no probes.")
@click.option("--probe-timeout", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              help="Seconds a probe (and, at most 10, a health check) may wait for its answer.")
@click.option("--probe-failures", type=click.IntRange(min=1), default=3, show_default=True,
              help="Failed probes of an entry point in a row before the watchdog kills its stopped stubs and "
                   "reloads its models; failed health checks in a row before it stops the server (exit 1).")
@click.option("--load-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds a watchdog reload may take before the server is stopped with an error.")
@click.option("--ports", "port_preset", type=click.Choice(["free", "default"]), default=None,
              help="default: Triton's usual ports, HTTP 8000, gRPC 8001, metrics 8002 (tools that assume them "
                   "work); free: a free port each. --grpc-port/--http-port/--metrics-port override either.")
@click.option("--openai-port", type=click.IntRange(0, 65535), default=None,
              help="Also serve an OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions) on "
                   "this port (0 = a free one), relaying to the ensembles over gRPC (docs/serving.md).")
@click.option("--chat-template", default=None,
              help="Jinja chat template for /v1/chat/completions when the tokenizer has none (a file), or "
                   "'plain' (role: content lines, then 'assistant:').")
@click.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
              help="gRPC over TLS (default: serving.tls of the repository's recipe): the server certificate (PEM); "
                   "needs --tls-key. Triton's HTTP has no TLS: it then binds to 127.0.0.1.")
@click.option("--tls-key", type=click.Path(dir_okay=False), default=None, help="gRPC over TLS: the server key (PEM).")
@click.option("--tls-ca", type=click.Path(dir_okay=False), default=None,
              help="Mutual TLS: clients must present a certificate this CA signed (PEM).")
@click.option("--tls-server-ca", type=click.Path(dir_okay=False), default=None,
              help="What the server's own clients (router relay, watchdog, OpenAI relay) verify its certificate "
                   "with (default: --tls-ca, else --tls-cert as self-signed).")
@click.option("--tls-server-name", default=None,
              help="The name those clients check in the certificate (default: its first DNS name).")
@click.option("--require-header", default=None, metavar="NAME",
              help="Every inference/metadata call must carry header NAME with the value of "
                   "$TRTSPEC_REQUIRED_HEADER_VALUE (a gateway adds it; gRPC: triton-grpc-protocol-NAME). "
                   "Default: serving.require_header. Health stays open.")
@handle_errors
def serve(repo: str, host: str | None, grpc_port: int | None, http_port: int | None, metrics_port: int | None,
          ready_timeout: float | None, as_json: bool, dry_run: bool, no_watchdog: bool, probe_every: float,
          probe_timeout: float, probe_failures: int,
          load_timeout: float, port_preset: str | None, openai_port: int | None, chat_template: str | None,
          tls_cert: str | None, tls_key: str | None, tls_ca: str | None, tls_server_ca: str | None,
          tls_server_name: str | None, require_header: str | None) -> None:
    """Serve a model repository with tritonserver until Ctrl-C, SIGTERM or SIGHUP.

    Uses the tritonserver on PATH (NVIDIA's container) or the one in nvidia-pytriton==0.7.0.
    Models are decoupled: clients use the gRPC streaming API (unary ModelInfer is rejected).
    TRT-LLM engines over several GPUs run as MPI ranks, as NVIDIA's launch_triton_server.py
    starts them (runtime.trtllm.launch_mode; docs/scaleout.md).

    A watchdog reloads a model whose python stub died (Triton 2.51 leaves it READY but failing)
    or, after --probe-failures failed probes in a row, the models of an entry point that answers
    nothing (a stopped stub is killed first); it logs it and counts it on /metrics
    (trtspec_watchdog_*). A reload that fails or hangs, and a server that answers no health check
    --probe-failures times in a row, stop the server with an error (exit 1). Single-process
    servers only.
    """
    if not dry_run:  # the python-backend models (router relay, tokenizers) run in the server's stubs
        require_extra("serve", ("numpy", "tritonclient", "tokenizers"), "trtspec serve")
    if (tls_cert is None) != (tls_key is None) or (tls_cert is None and (tls_ca or tls_server_ca or tls_server_name)):
        raise click.UsageError("--tls-cert and --tls-key go together (and the other --tls-* options need them)")
    watchdog = None if no_watchdog else WatchdogSettings(probe_every_s=probe_every or None,
                                                         probe_timeout_s=probe_timeout,
                                                         probe_failures=probe_failures,
                                                         health_timeout_s=min(probe_timeout, 10.0),
                                                         load_timeout_s=load_timeout)
    if port_preset is not None:  # Triton's own defaults, or 0 = free; explicit ports win
        preset = (8001, 8000, 8002) if port_preset == "default" else (0, 0, 0)
        grpc_port, http_port, metrics_port = (p if p is not None else d for p, d in
                                              zip((grpc_port, http_port, metrics_port), preset))
    if chat_template is not None and openai_port is None:
        raise click.UsageError("--chat-template is for the OpenAI endpoint: add --openai-port PORT")
    server = with_repository_layout(server_for_repository(
        repo, host=host, grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port,
        ready_timeout=ready_timeout, watchdog=watchdog,
        tls=TlsSettings(tls_cert, tls_key, tls_ca, tls_server_ca, tls_server_name) if tls_cert else None,
        required_header=RequiredHeader.from_env(require_header) if require_header else None,
        on_watchdog_event=lambda ev: err.print(str(ev), markup=False)))
    if dry_run:
        plan = planned_launch(server)
        if 0 in server.ports:
            err.print("note: ports left at 0 (a free port at start) are shown as Triton's defaults; "
                      "pass --grpc-port, --http-port and --metrics-port to fix them", markup=False)
        if as_json:
            click.echo(json.dumps(plan.to_dict(), indent=2))
        else:
            click.echo(plan.describe(), nl=False)
        return
    err.print(f"starting tritonserver on {repo} ...")
    # handlers go in before the start: a signal between readiness and serve_forever is not lost,
    # and one during start-up stops what was started (exit 128+signal) instead of orphaning it
    with StopSignals() as signals:
        try:
            _serve_until_stopped(server, repo, signals, as_json, openai_port, chat_template)
        except StopRequested as e:
            err.print(f"stopped by {e} before the server was ready; nothing left running")
            sys.exit(128 + e.signum)
    err.print(f"stopped (tritonserver exit code {server.returncode})")


def _serve_until_stopped(server, repo: str, signals, as_json: bool, openai_port: int | None = None,
                         chat_template: str | None = None) -> None:
    with server, contextlib.ExitStack() as relay_stack:
        signals.serving = True  # ready: from here a signal means "drain and stop", exit 0
        e = server.endpoints
        exposed = exposure_warning(e.host, e.grpc_port, e.http_port, e.metrics_port, tls=server.tls is not None,
                                   required_header=server.required_header)
        if exposed:
            err.print(f"warning: {exposed}", markup=False, highlight=False, style="yellow")
        relay = None
        if openai_port is not None:  # stopped (by the ExitStack) before the server
            url, options = server.client_target()
            # the OpenAI port is under the deployment's controls too: its TLS (HTTPS, mutual with a CA),
            # its required header, the recipe's limits (docs/security.md)
            relay = relay_stack.enter_context(relay_for_repository(
                repo, url, host=e.host, port=openai_port, chat_template=chat_template, client_options=options,
                required_header=server.required_header, tls=server.tls))
            exposed_openai = openai_exposure_warning(e.host, relay.port, tls=server.tls,
                                                     required_header=server.required_header)
            if exposed_openai:
                err.print(f"warning: {exposed_openai}", markup=False, highlight=False, style="yellow")
        if as_json:
            click.echo(json.dumps({**e.to_dict(), **({"openai": relay.url} if relay else {}),
                                   "log": str(server.log_path), "watchdog": server.watchdog is not None}), nl=True)
            sys.stdout.flush()
        else:
            out.print(f"[green]ready[/]: {repo}")
            out.print(f"  gRPC     {'grpcs://' + e.grpc + '  (TLS)' if server.tls is not None else e.grpc}")
            out.print(f"  HTTP     {e.http}")
            if server.required_header is not None:
                out.print(f"  header   {server.required_header.name} required on inference/metadata calls")
            out.print(f"  metrics  {e.metrics}")
            if relay is not None:
                out.print(f"  OpenAI   {relay.url}  (/models, /completions, /chat/completions)")
            models = (read_repository_manifest(repo) or {}).get("entry_points")
            if models:
                out.print(f"  models   {models['speculative']} (speculative path), {models['baseline']} (baseline)")
            out.print(f"  log      {server.log_path}")
            if server.watchdog is not None:
                out.print("  watchdog reloads models whose python stub died or that stop answering "
                          "(trtspec_watchdog_* on /metrics)")
            out.print("[dim]Ctrl-C to stop[/]")
        server.serve_forever(signals)
        err.print("stopping (draining in-flight requests) ...")

