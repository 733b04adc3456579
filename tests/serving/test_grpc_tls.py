"""A real tritonserver with gRPC over TLS (a self-signed certificate made here) and every gRPC
protocol restricted to callers that send a header: the client with the right options works;
without them each failure is one clear error with its own exit code.

The repository is one small python model with NVIDIA's text tensor names (``text_input`` →
``text_output``), so the server starts in seconds; what is tested is the transport.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.triton.launch.server import TritonServer, free_port
from tests.serving.certs import self_signed_cert

KEY, SECRET = "trtspec-key", "s3cret"
HEADER = f"triton-grpc-protocol-{KEY}"  # what Triton expects for --grpc-restricted-protocol=...:KEY=VALUE
# the protocols the launcher does not already restrict to its own secret (triton/access.py)
PROTOCOLS = "health,metadata,inference,model-config,statistics"

CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 0
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

MODEL = textwrap.dedent('''
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                text = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy().reshape(-1)[0]
                reply = np.array([b"echo: " + text], dtype=np.object_)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", reply)]))
            return out
''')


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(certs, tmp_path_factory):
    cert, key = certs
    repo = tmp_path_factory.mktemp("tls-repo")
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "config.pbtxt").write_text(CONFIG)
    (repo / "echo" / "1" / "model.py").write_text(MODEL)
    extra = ("--grpc-use-ssl=true", f"--grpc-server-cert={cert}", f"--grpc-server-key={key}",
             f"--grpc-root-cert={cert}", f"--grpc-restricted-protocol={PROTOCOLS}:{KEY}={SECRET}")
    with TritonServer(repo, workdir=tmp_path_factory.mktemp("tls-server"), ready_timeout=120,
                      extra_args=extra) as s:
        yield s


def infer(url, *options):
    return CliRunner().invoke(main, ["infer", url, "--model", "echo", "--prompt", "hello", "--ready-timeout", "5",
                                     *options])


def test_tls_and_header_work(server, certs):
    cert, _ = certs
    r = infer(f"grpcs://{server.endpoints.grpc}", "--tls-ca", str(cert), "--header", f"{HEADER}: {SECRET}")
    assert r.exit_code == 0, r.output
    assert r.output == "echo: hello\n"
    r = infer(f"grpcs://{server.endpoints.grpc}", "--tls-ca", str(cert), "--header", f"{HEADER}: {SECRET}", "--json")
    assert json.loads(r.output)["text"] == "echo: hello"


def _one_error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


def test_without_the_right_options_each_failure_is_clear(server, certs):
    cert, _ = certs
    g = server.endpoints.grpc
    r = infer(f"grpc://{g}", "--header", f"{HEADER}: {SECRET}")  # plaintext against TLS
    assert r.exit_code == 5, r.output
    assert f"grpcs://{g}" in r.output
    _one_error_line(r.output)
    r = infer(f"grpcs://{g}", "--header", f"{HEADER}: {SECRET}")  # the self-signed CA is not trusted
    assert r.exit_code == 5 and "TLS handshake failed" in _one_error_line(r.output) and "--tls-ca" in r.output
    r = infer(f"grpcs://{g}", "--tls-ca", str(cert))  # no header
    assert r.exit_code == 6 and "refused the credentials" in _one_error_line(r.output), r.output
    assert f"--header '{HEADER}: VALUE'" in r.output
    r = infer(f"grpcs://{g}", "--tls-ca", str(cert), "--header", f"{HEADER}: wrong")
    assert r.exit_code == 6, r.output
    r = infer(f"grpcs://127.0.0.1:{free_port()}", "--tls-ca", str(cert))  # nothing there
    assert r.exit_code == 4 and "no Triton server is reachable" in _one_error_line(r.output)
    r = infer(f"grpc://{g}", "--tls-ca", str(cert))  # TLS files with a plaintext URL: bad input
    assert r.exit_code == 2 and f"grpcs://{g}" in r.output


def test_bench_over_tls(server, certs, tmp_path):
    cert, _ = certs
    r = CliRunner().invoke(main, ["bench", "--url", f"grpcs://{server.endpoints.grpc}", "--tls-ca", str(cert),
                                  "--header", f"{HEADER}: {SECRET}", "--model", "echo", "--no-baseline", "--no-stream",
                                  "--concurrency", "1", "--requests", "3", "--warmup", "0", "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "report.json").read_text())
    assert d["url"] == f"grpcs://{server.endpoints.grpc}"
    assert d["levels"][0]["models"]["speculative"]["requests"] == 3
    assert d["levels"][0]["models"]["speculative"]["errors"] == 0
