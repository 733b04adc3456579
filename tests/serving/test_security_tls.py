"""gRPC over TLS on the server side (trtspec.triton.access.TlsSettings): a real tritonserver with
certificates made here by openssl; plaintext clients are refused, TLS clients with the CA are
served, mutual TLS needs a client certificate; the router falls back to BLS under TLS."""

from __future__ import annotations

import shutil

import pytest
import tritonclient.grpc as grpcclient

from trtspec.errors import ConfigError
from trtspec.triton.access import TlsSettings
from trtspec.triton.backend.router import relay_mode
from trtspec.triton.launch.server import TritonServer

from tests.serving.certs import openssl_pki
from tests.serving.test_triton_launcher import model

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return openssl_pki(tmp_path_factory.mktemp("pki"))


def _ready(url, **ssl) -> bool:
    c = grpcclient.InferenceServerClient(url, **ssl)
    try:
        return c.is_server_ready(client_timeout=5)
    except Exception:  # noqa: BLE001 - a refused handshake
        return False
    finally:
        c.close()


def test_grpc_over_tls_refuses_plaintext(pki, tmp_path):
    model(tmp_path / "repo", "echo")
    tls = TlsSettings(str(pki / "server.pem"), str(pki / "server.key"))
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w", tls=tls) as s:
        assert "--grpc-use-ssl=true" in s.cmd
        url = f"localhost:{s.endpoints.grpc_port}"
        assert not _ready(url)
        assert _ready(url, ssl=True, root_certificates=str(pki / "ca.pem"))


def test_mutual_tls_needs_a_client_certificate(pki, tmp_path):
    model(tmp_path / "repo", "echo")
    tls = TlsSettings(str(pki / "server.pem"), str(pki / "server.key"), ca=str(pki / "ca.pem"))
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w", tls=tls) as s:
        url = f"localhost:{s.endpoints.grpc_port}"
        assert not _ready(url, ssl=True, root_certificates=str(pki / "ca.pem"))
        assert _ready(url, ssl=True, root_certificates=str(pki / "ca.pem"), private_key=str(pki / "client.key"),
                      certificate_chain=str(pki / "client.pem"))


def test_tls_files_are_checked_and_the_router_relays_over_bls_under_tls(tmp_path):
    with pytest.raises(ConfigError, match="--tls-cert"):
        TlsSettings(str(tmp_path / "missing.pem"), str(tmp_path / "k")).check()
    argv = ["tritonserver", "--grpc-port=9", "--grpc-use-ssl=true"]
    assert relay_mode("auto", argv)[0] == "bls" and "TLS" in relay_mode("auto", argv)[1]
    assert relay_mode("auto", argv, tls=True) == ("grpc", "127.0.0.1:9")
    assert relay_mode("auto", ["tritonserver", "--grpc-port=9"])[0] in ("grpc", "bls")
