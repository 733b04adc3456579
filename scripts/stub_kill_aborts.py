#!/usr/bin/env python
"""How often a SIGKILLed python stub takes Triton 2.51 itself down.

Serves the tiny pair (the fault tests' deployment: draft-target, torch engine workers) under the
watchdog, then, ``--kills`` times, streams a long request through ``ensemble_baseline`` and
SIGKILLs the router stub at its second response, as tests/serving/test_faults.py does. After each
kill: did the watchdog reload the engine and the router, or did tritonserver abort (its log's
``terminate called ... boost::interprocess::lock_exception`` / ``Signal (6)``, read by
``trtspec.triton.launch.server.native_abort``)? An aborted server is started again and the loop
goes on. Prints a table; writes bench/results/stub_kill_aborts.{json,md}.

    .venv/bin/python scripts/stub_kill_aborts.py [--kills 20] [--stub router_baseline_0_0]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import signal
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trtspec.checkpoints.tiny import make_tiny_models  # noqa: E402
from trtspec.client import LLMClient, Sampling  # noqa: E402
from trtspec.config import parse_recipe  # noqa: E402
from trtspec.triton.launch.server import TritonServer, native_abort  # noqa: E402
from trtspec.triton.launch.watchdog import WatchdogSettings  # noqa: E402
from trtspec.triton.procs import stubs_of  # noqa: E402
from trtspec.triton.render import package  # noqa: E402

PROMPT = "import os\n\ndef main():\n"


def start(repo: pathlib.Path, workdir: pathlib.Path) -> TritonServer:
    os.environ["OMP_WAIT_POLICY"] = "passive"
    # a kill per loop is no crash loop: the watchdog may reload as often as the loop kills
    return TritonServer(repo, workdir=workdir, ready_timeout=300, exit_timeout=2,
                        entry_points=("ensemble", "ensemble_baseline"),
                        watchdog=WatchdogSettings(interval_s=0.5, probe_every_s=None, load_timeout_s=180,
                                                  max_reloads=10_000)).start()


def one_kill(server: TritonServer, stub: str, settle_s: float) -> dict:
    seen = len(server.watchdog.events)
    chunks = []

    def kill_on_second(_):
        chunks.append(1)
        if len(chunks) == 2:
            os.kill(next(s.pid for s in stubs_of(server.proc.pid) if s.instance == stub), signal.SIGKILL)

    with LLMClient(server.endpoints.grpc, retries=0) as c:
        try:
            c.generate(PROMPT, Sampling(max_tokens=400), model="ensemble_baseline", on_chunk=kill_on_second,
                       timeout_s=4)
            client = "completed"
        except Exception as e:  # noqa: BLE001 - what the client saw is the record
            client = type(e).__name__
    time.sleep(settle_s)  # the watchdog's reloads, or the abort
    abort = native_abort(server.log_text()) if server.proc.poll() is not None else None
    return {"client": client, "aborted": abort is not None, "abort": abort,
            "events": [f"{e.kind} {e.model}" for e in server.watchdog.events[seen:]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--stub", default="router_baseline_0_0", help="the stub instance to kill")
    ap.add_argument("--settle", type=float, default=12.0, help="seconds after each kill before the next")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    pair = make_tiny_models(ROOT / "models")
    root = pathlib.Path(tempfile.mkdtemp(prefix="stub-kill-"))
    package(parse_recipe({
        "name": "tiny-stub-kill", "target": {"model": str(pair.target_dir)},
        "speculation": {"method": "draft_target", "draft": {"model": str(pair.draft_dir)}, "max_draft_len": 4},
        "runtime": {"backend": "torch", "dtype": "float32", "device": "cpu", "torch_threads": 1},
        "limits": {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 512}}), root / "repo")
    server, starts, rows = None, 0, []
    try:
        for i in range(args.kills):
            if server is None or not server.running:
                if server is not None:
                    server.stop()
                starts += 1
                server = start(root / "repo", root / f"server{starts}")
            row = {"kill": i + 1, "server": starts, **one_kill(server, args.stub, args.settle)}
            rows.append(row)
            print(f"{row['kill']:>3}  server {starts}  client {row['client']:<18} "
                  f"{'ABORTED: ' + row['abort'][:90] if row['aborted'] else ', '.join(row['events'])}", flush=True)
    finally:
        if server is not None:
            server.stop()
    aborts = sum(r["aborted"] for r in rows)
    result = {"when": dt.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
              "cpus": os.cpu_count(), "stub": args.stub, "kills": len(rows), "triton_aborts": aborts,
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stub_kill_aborts.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"# SIGKILL of `{args.stub}` mid-stream, {len(rows)} times ({result['when']}, {result['cpus']} CPUs)", "",
          f"tritonserver aborted **{aborts} of {len(rows)}** times; otherwise the watchdog reloaded and it served on.",
          "", "| kill | server | client saw | outcome |", "|---|---|---|---|"]
    md += [f"| {r['kill']} | {r['server']} | {r['client']} | "
           f"{r['abort'] if r['aborted'] else '; '.join(r['events'])} |" for r in rows]
    (args.out / "stub_kill_aborts.md").write_text("\n".join(md) + "\n")
    print(f"\ntritonserver aborted {aborts} of {len(rows)} kills -> {args.out / 'stub_kill_aborts.md'}")


if __name__ == "__main__":
    main()
