"""Soak: N concurrent streaming clients for M minutes; nothing may be lost, leak or drift.

    .venv/bin/python scripts/soak.py --clients 8 --minutes 5 [--config build_configs/tiny-cpu-draft-target.yaml]

Packages the recipe into a temporary repository and serves it as `trtspec serve` does (watchdog
on). Each client streams greedy requests back to back, half through `ensemble`, half through
`ensemble_baseline`, cycling over the prompts. Every output is compared with the one the server
gave for that prompt before the soak (greedy decoding is deterministic; speculation is lossless).

Counts: sent, completed (correct output), corrupted (completed with another output), failed (an
error, by kind), lost (sent but never answered within the grace period after the end). Memory:
RSS of tritonserver and of every python stub (``/proc``), sampled every few seconds; growth is the
last minute's mean minus the first minute's (after the warm-up). Latency: p50/p95 of request
latency and TTFT per time window; drift = last window's p95 / first window's. Watchdog events
are listed. Writes bench/results/soak.json and soak.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

# OpenMP threads that spin while waiting make a loaded 2-core machine 10-20x slower; the server
# inherits this environment (see scripts/bench_serving.py)
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from trtspec.client import AsyncLLMClient, Sampling, ServerRequestError  # noqa: E402
from trtspec.config import load_recipe  # noqa: E402
from trtspec.prompts import load_prompts  # noqa: E402
from trtspec.acceptance import percentile  # noqa: E402
from trtspec.triton.procs import rss_bytes, stubs_of, workers_of  # noqa: E402
from trtspec.triton.render import package  # noqa: E402
from trtspec.triton.launch.server import server_for_repository  # noqa: E402
from trtspec.triton.launch.watchdog import WatchdogSettings  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIB = 1024 * 1024


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "build_configs" / "tiny-cpu-draft-target.yaml"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompts", default="builtin:code")
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--window-s", type=float, default=30.0, help="latency windows")
    ap.add_argument("--sample-s", type=float, default=5.0, help="memory samples")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    ap.add_argument("--grace-s", type=float, default=60.0, help="after the end, for requests in flight")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "soak"))
    return ap.parse_args(argv)


class Memory:
    """RSS of the server and its stubs over time."""

    def __init__(self, server_pid: int):
        self.server_pid = server_pid
        self.samples: list[tuple[float, dict[str, int]]] = []

    def sample(self, t: float) -> None:
        procs = {"tritonserver": rss_bytes(self.server_pid) or 0}
        for s in stubs_of(self.server_pid):
            procs[s.instance] = rss_bytes(s.pid) or 0
            for w in workers_of(s.pid):  # the torch engine's own process (serving.engine_process worker)
                procs[f"{s.instance}/worker"] = rss_bytes(w) or 0
        procs["total"] = sum(procs.values())
        self.samples.append((t, procs))

    def growth(self, first_s: float, last_s: float) -> dict[str, dict]:
        """Per process: mean RSS in [first_s, first_s + 60) and in the last 60 s before last_s."""
        out = {}
        names = sorted({k for _, p in self.samples for k in p})
        for name in names:
            early = [p[name] for t, p in self.samples if first_s <= t < first_s + 60 and name in p]
            late = [p[name] for t, p in self.samples if last_s - 60 <= t <= last_s and name in p]
            peak = max((p[name] for _, p in self.samples if name in p), default=0)
            if early and late:
                a, b = sum(early) / len(early), sum(late) / len(late)
                out[name] = {"first_minute_mib": round(a / MIB, 1), "last_minute_mib": round(b / MIB, 1),
                             "growth_mib": round((b - a) / MIB, 1), "growth_pct": round(100 * (b - a) / a, 2) if a else None,
                             "peak_mib": round(peak / MIB, 1)}
        return out


async def soak(url: str, args, prompts: list[str], reference: dict, mem: Memory | None) -> dict:
    greedy = Sampling(max_tokens=args.max_tokens)
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    counts = {"sent": 0, "completed": 0, "corrupted": 0, "failed": 0, "lost": 0}
    errors: dict[str, int] = {}
    done: list[dict] = []  # per completed request: t (since start, at the end), latency, ttft, model
    inflight: set[asyncio.Task] = set()

    async def client(i: int, c: AsyncLLMClient):
        model = "ensemble" if i % 2 == 0 else "ensemble_baseline"
        k = i
        while time.monotonic() < end:
            p = prompts[k % len(prompts)]
            k += 1
            counts["sent"] += 1
            task = asyncio.ensure_future(c.generate(p, greedy, model=model, timeout_s=args.timeout_s))
            inflight.add(task)
            try:
                r = await task
            except ServerRequestError as e:
                counts["failed"] += 1
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                continue
            finally:
                inflight.discard(task)
            if r.token_ids != reference[p]:
                counts["corrupted"] += 1
                continue
            counts["completed"] += 1
            done.append({"t": time.monotonic() - t0, "latency": r.latency_s, "ttft": r.ttft_s, "model": model})

    async def sampler():
        while time.monotonic() < end + args.grace_s:
            if mem is not None:
                mem.sample(time.monotonic() - t0)
            await asyncio.sleep(args.sample_s)

    async with AsyncLLMClient(url, retries=0) as c:
        s = asyncio.create_task(sampler())
        workers = [asyncio.create_task(client(i, c)) for i in range(args.clients)]
        finished, pending = await asyncio.wait(workers, timeout=args.minutes * 60 + args.grace_s)
        counts["lost"] = len(inflight)  # sent, never answered within the grace period
        for t in list(inflight) + list(pending):
            t.cancel()
        s.cancel()
    duration = time.monotonic() - t0
    windows = []
    w = 0.0
    while w < args.minutes * 60:
        sel = [d for d in done if w <= d["t"] < w + args.window_s]
        if sel:
            lat = [d["latency"] for d in sel]
            ttft = [d["ttft"] for d in sel if d["ttft"] is not None]
            windows.append({"from_s": w, "to_s": w + args.window_s, "completed": len(sel),
                            "latency_p50_s": percentile(lat, 50), "latency_p95_s": percentile(lat, 95),
                            "ttft_p95_s": percentile(ttft, 95) if ttft else None})
        w += args.window_s
    drift = None
    if len(windows) >= 2:
        drift = {"latency_p95_first_s": windows[0]["latency_p95_s"], "latency_p95_last_s": windows[-1]["latency_p95_s"],
                 "ratio": windows[-1]["latency_p95_s"] / windows[0]["latency_p95_s"]}
    return {"counts": counts, "errors": errors, "duration_s": duration, "windows": windows, "drift": drift,
            "requests_per_s": counts["completed"] / duration if duration else None}


def main(argv=None) -> int:
    args = parse_args(argv)
    recipe = load_recipe(args.config)
    prompts = load_prompts(args.prompts, args.num_prompts)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="trtspec-soak-") as tmp:
        repo = package(recipe, pathlib.Path(tmp) / "repo").path
        events = []
        server = server_for_repository(repo, workdir=pathlib.Path(tmp) / "server", on_watchdog_event=events.append,
                                       watchdog=WatchdogSettings())  # as `trtspec serve`: probes every 30 s
        with server:
            url = server.endpoints.grpc
            print(f"serving {repo} at {url}; reference outputs ...", file=sys.stderr)

            async def refs():
                async with AsyncLLMClient(url) as c:
                    await c.wait_ready(["ensemble", "ensemble_baseline"])
                    out = {}
                    for p in prompts:
                        base = await c.generate(p, Sampling(max_tokens=args.max_tokens), model="ensemble_baseline")
                        spec = await c.generate(p, Sampling(max_tokens=args.max_tokens), model="ensemble")
                        if base.token_ids != spec.token_ids:
                            raise SystemExit(f"speculative and baseline differ before the soak on: {p[:40]!r}")
                        out[p] = base.token_ids
                    return out

            reference = asyncio.run(refs())
            mem = Memory(server.proc.pid)
            print(f"soak: {args.clients} clients x {args.minutes} min ...", file=sys.stderr)
            res = asyncio.run(soak(url, args, prompts, reference, mem))
            growth = mem.growth(first_s=60.0 if args.minutes > 3 else 0.0, last_s=args.minutes * 60)
        if events:  # a stub died or was reloaded: keep the server log's evidence beside the results
            stem = pathlib.Path(args.out)
            stem.parent.mkdir(parents=True, exist_ok=True)
            log_file = server.log_path
            log = log_file.read_text(errors="replace").splitlines() if log_file and log_file.is_file() else []
            (stem.parent / f"{stem.name}_server_log_tail.txt").write_text("\n".join(log[-400:]) + "\n")
    result = {
        "kind": "soak", "started": started, "config": os.path.relpath(args.config, ROOT),
        "command": "python scripts/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
        "settings": {"clients": args.clients, "minutes": args.minutes, "max_tokens": args.max_tokens,
                     "prompts": f"{args.prompts} ({len(prompts)})", "window_s": args.window_s, "stream": True,
                     "models": "even clients ensemble, odd ensemble_baseline"},
        **res,
        "memory": growth,
        "memory_samples": [{"t_s": round(t, 1), **{k: round(v / MIB, 1) for k, v in p.items()}} for t, p in mem.samples],
        "watchdog_events": [e.to_dict() for e in events],
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result) + "\n")
    print(markdown(result))
    c = res["counts"]
    return 0 if c["lost"] == 0 and c["corrupted"] == 0 and c["failed"] == 0 else 1


def markdown(r: dict) -> str:
    c, s = r["counts"], r["settings"]
    lines = [
        "# Soak: concurrent streaming clients",
        "",
        f"`{r['command']}` — {r['config']}, {s['clients']} clients × {s['minutes']} min, max_tokens "
        f"{s['max_tokens']}, streaming, {s['models']}; started {r['started']}; {r['machine']['cpus']} CPUs "
        f"(1-min load average {r['machine']['load_avg_1m_at_end']} at the end).",
        "",
        "| sent | completed | corrupted | failed | lost | requests/s |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {c['sent']} | {c['completed']} | {c['corrupted']} | {c['failed']} | {c['lost']} | "
        f"{r['requests_per_s']:.2f} |",
    ]
    if r["errors"]:
        lines += ["", "Errors: " + ", ".join(f"{k} {n}" for k, n in r["errors"].items())]
    lines += ["", "## Memory (RSS)", "", "| process | first minute MiB | last minute MiB | growth MiB | growth % | peak MiB |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, m in r["memory"].items():
        lines.append(f"| {name} | {m['first_minute_mib']} | {m['last_minute_mib']} | {m['growth_mib']} | "
                     f"{m['growth_pct']} | {m['peak_mib']} |")
    lines += ["", "## Latency by time window", "", "| window s | completed | latency p50 ms | latency p95 ms | TTFT p95 ms |",
              "|---|---:|---:|---:|---:|"]
    for w in r["windows"]:
        ttft = "-" if w["ttft_p95_s"] is None else f"{w['ttft_p95_s'] * 1e3:.0f}"
        lines.append(f"| {w['from_s']:.0f}-{w['to_s']:.0f} | {w['completed']} | {w['latency_p50_s'] * 1e3:.0f} | "
                     f"{w['latency_p95_s'] * 1e3:.0f} | {ttft} |")
    if r["drift"]:
        d = r["drift"]
        lines += ["", f"p95 latency drift (last window / first): {d['ratio']:.2f} "
                      f"({d['latency_p95_first_s'] * 1e3:.0f} → {d['latency_p95_last_s'] * 1e3:.0f} ms)"]
    lines += ["", f"Watchdog events: {len(r['watchdog_events'])}"
              + "".join(f"\n- {e['kind']} {e['model']}: {e['detail']}" for e in r["watchdog_events"])]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
