"""Resident memory of each python stub of a served tiny pair, and whether torch is loaded in it.

    .venv/bin/python scripts/stub_memory.py [--engine-process worker|thread]

Serves the tiny pair (./models, as the serving tests do) with the torch runtime, sends one request
so every model has run, then prints one line per stub: model, VmRSS from /proc/<pid>/status, and
whether a torch library is mapped into it (/proc/<pid>/maps). The engine workers are listed too.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def vm_rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def maps_torch(pid: int) -> bool:
    return "libtorch" in pathlib.Path(f"/proc/{pid}/maps").read_text()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine-process", choices=("worker", "thread"), default="worker")
    a = ap.parse_args()

    from trtspec.client import LLMClient, Sampling
    from trtspec.config import parse_recipe
    from trtspec.triton.launch.server import TritonServer
    from trtspec.triton.procs import stubs_of, workers_of
    from trtspec.triton.render import package

    target, draft = ROOT / "models" / "tiny-target", ROOT / "models" / "tiny-draft"
    recipe = parse_recipe({
        "name": "stub-memory",
        "target": {"model": str(target)},
        "speculation": {"method": "draft_target", "draft": {"model": str(draft)}, "max_draft_len": 4},
        "runtime": {"backend": "torch", "dtype": "float32", "device": "cpu", "torch_threads": 1},
        "limits": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512},
        "serving": {"engine_process": a.engine_process},
    })
    with tempfile.TemporaryDirectory() as tmp:
        package(recipe, pathlib.Path(tmp) / "repo")
        with TritonServer(pathlib.Path(tmp) / "repo", workdir=pathlib.Path(tmp) / "server", ready_timeout=240) as s:
            with LLMClient(s.endpoints.grpc) as c:
                c.generate("def add(a, b):", Sampling(max_tokens=8))
            print(f"engine_process: {a.engine_process}")
            for stub in sorted(stubs_of(s.proc.pid), key=lambda st: st.model):
                print(f"stub   {stub.model:<22} pid {stub.pid:>7}  VmRSS {vm_rss_kib(stub.pid) / 1024:7.1f} MiB"
                      f"  torch {'loaded' if maps_torch(stub.pid) else 'not loaded'}")
                for w in workers_of(stub.pid):
                    print(f"worker {stub.model:<22} pid {w:>7}  VmRSS {vm_rss_kib(w) / 1024:7.1f} MiB"
                          f"  torch {'loaded' if maps_torch(w) else 'not loaded'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
